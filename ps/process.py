"""``python -m ps``: a parameter-server task: serve until shut down.

Validates ``TF_CONFIG`` strictly (this task must be ``ps:N`` of the cluster), starts the task's
gRPC server with its Control service (health checks, heartbeats, failure reports, Shutdown) and
serves until a Shutdown RPC, SIGTERM or SIGINT, then exits 0. A worker's failure report is
logged, not fatal: parameter servers outlive worker failures, as in TensorFlow.
A SIGTERM while the coordinator runs is a preemption notice: the task tells the cluster and
serves on (up to ``CLUSTER_GRACE_PERIOD``) until the coordinator has saved and left, then exits
204 (:mod:`cluster._serving` has the protocol and the exit codes).
The task also serves its variable store (``ps.servicer.PsService``, ``proto/ps.proto``) and
prints ``ps:N: serving the variable store on HOST:PORT`` to stderr once it does.
"""

from __future__ import annotations

import os
import sys

from cluster import _serving, exitcodes, lifecycle
from cluster._stacks import enable_stack_dumps
from cluster.errors import ClusterError, PeersNotReadyError
from cluster.ps.store import VariableStore
from cluster.transport import _malloc
from cluster.transport.ps_client import SERVICE
from ps.servicer import PsService

__all__ = ["main", "run"]

USAGE = """\
usage: python -m ps

Serve as the parameter-server task TF_CONFIG names until a Shutdown RPC, SIGTERM or SIGINT.
On SIGTERM while the coordinator runs, serve on (up to CLUSTER_GRACE_PERIOD seconds) until it
has saved its checkpoint and left, then exit 204.

environment:
  TF_CONFIG       the cluster and this task (required; task type "ps")
  CLUSTER_TOKEN   the cluster's shared secret (clusterctl sets it)
"""


def _fail(message: str) -> None:
    print(f"ps: error: {message}", file=sys.stderr, flush=True)



def main(argv: list[str] | None = None) -> None:
    lifecycle.exit_with(run(sys.argv[1:] if argv is None else argv))


def run(argv: list[str]) -> int:
    """Everything ``python -m ps`` does; returns the exit code."""
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return exitcodes.EXIT_OK
    if argv:
        _fail(f"unexpected arguments {' '.join(argv)!r}\n{USAGE}")
        return exitcodes.EXIT_USAGE
    lifecycle.setup_logging()
    enable_stack_dumps()  # SIGUSR2: clusterctl asks for the stacks before it stops a hung run
    lifecycle.install_termination_handlers(_serving.SERVING_SIGNALS)
    _malloc.tune_for_large_buffers(one_arena=True)  # tensor-sized replies: no page faults
    store = VariableStore()
    service = PsService(store)
    rt = lifecycle.start_runtime("ps", os.environ, services={SERVICE: service.handlers()})
    if isinstance(rt, int):
        return rt
    try:
        if rt.task_type != "ps":
            _fail(f"TF_CONFIG makes this task {rt.task}: run it with `python -m worker SCRIPT`, "
                  "not `python -m ps`")
            return exitcodes.EXIT_USAGE
        store.task = service.task = rt.task  # names the task in store errors
        # A synchronous step has one contributor per worker (the chief may push too): a push
        # naming more could never complete and would hold an RPC thread until its deadline.
        service.max_contributors = max(1, sum(
            1 for task, _ in rt.placement.tasks() if task.split(":")[0] in ("worker", "chief")))
        print(f"{rt.task}: serving the variable store on {rt.address}", file=sys.stderr,
              flush=True)
        lifecycle.watch_launcher(rt.settings.launcher_pid)
        try:
            rt.join()  # the coordination service: the chief waits for every task to register
        except ClusterError as e:
            _fail(str(e))
            return exitcodes.EXIT_PEERS_NOT_READY if isinstance(e, PeersNotReadyError) \
                else exitcodes.EXIT_USAGE
        return _serving.serve(rt)
    except lifecycle.Terminated as e:  # before it served: nothing to keep serving for
        print(f"{rt.task}: shutting down ({e})", file=sys.stderr, flush=True)
        return exitcodes.EXIT_OK
    finally:
        lifecycle.absorb_termination()  # already stopping: a second signal must not cut cleanup
        rt.shutdown()
