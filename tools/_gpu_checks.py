"""The Python checks of ``tools/gpu_check.sh``, one per subcommand.

    uv run --no-sync python tools/_gpu_checks.py preflight          # why not, or the GPU's name
    uv run --no-sync python tools/_gpu_checks.py mirrored           # MirroredStrategy on GPU 0
    uv run --no-sync python tools/_gpu_checks.py two-tasks shm      # or: network
    uv run --no-sync python tools/_gpu_checks.py jax

Each prints what it found and, last, one line: the figure ``gpu_check.sh`` shows. Exit status:
0 the check passed, 1 it failed (the last line says how), 77 it could not run here (the last
line says why: no GPU, a package missing).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SKIP = 77


class Skip(Exception):
    """The check cannot run here; the message says why."""


def require_gpu() -> str:
    """The name of GPU 0, or :class:`Skip` saying why CuPy cannot use one."""
    try:
        import cupy
    except ImportError as e:
        raise Skip("no GPU usable: CuPy is not installed (uv sync --inexact --extra gpu, or "
                   "--extra gpu-cuda13 for CUDA 13 drivers)") from e
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # no driver / no device: CuPy raises its own runtime error types
        raise Skip(f"no GPU: CuPy sees no CUDA device ({e})") from e
    if not count:
        raise Skip("no GPU: CuPy sees no CUDA device")
    properties = getattr(cupy.cuda.runtime, "getDeviceProperties", None)  # the name is cosmetic
    name = properties(0)["name"] if properties else "GPU 0"
    return name.decode() if isinstance(name, bytes) else str(name)


def preflight() -> str:
    name = require_gpu()
    import cupy

    return f"{name}, CuPy {cupy.__version__}, {cupy.cuda.runtime.getDeviceCount()} GPU(s)"


# -- MirroredStrategy on GPU 0 -------------------------------------------------------------------

OPTIMIZERS = {
    "SGD": lambda o: o.SGD(0.1),
    "momentum": lambda o: o.SGD(0.1, momentum=0.9),
    "Nesterov": lambda o: o.SGD(0.1, momentum=0.9, nesterov=True),
    "Adam": lambda o: o.Adam(0.01),
}


def _train(device: str, make_optimizer, steps: int = 5) -> tuple[bytes, type]:
    """Bytes of a variable after ``steps`` updates on a one-replica strategy on ``device``."""
    import cupy

    import cluster

    strategy = cluster.MirroredStrategy([device])
    xp = cupy if "gpu" in device.lower() else np
    rng = np.random.default_rng(0)
    start = rng.standard_normal(1000).astype(np.float32)
    grads = [rng.standard_normal(1000).astype(np.float32) for _ in range(steps)]
    with strategy.scope():
        v = cluster.Variable(xp.asarray(start))
        optimizer = make_optimizer(cluster.optimizers)
    for g in grads:
        strategy.run(lambda g=g: optimizer.apply_gradients([(xp.asarray(g), v)]))
    value = v.value()
    host = cupy.asnumpy(value) if isinstance(value, cupy.ndarray) else np.asarray(value)
    return host.tobytes(), type(value)


def mirrored() -> str:
    require_gpu()
    import cupy

    for name, make in OPTIMIZERS.items():
        gpu, kind = _train("/gpu:0", make)
        cpu, _ = _train("/cpu:0", make)
        if kind is not cupy.ndarray:
            raise AssertionError(f"{name}: a /gpu:0 variable holds a {kind.__name__}, not CuPy")
        if gpu != cpu:
            raise AssertionError(f"{name}: /gpu:0 and /cpu:0 give different bytes")
    return f"{', '.join(OPTIMIZERS)} on /gpu:0 bitwise equal to /cpu:0, values stay CuPy"


# -- two tasks sharing GPU 0 ---------------------------------------------------------------------

DTYPES = ("float16", "float32", "float64", "int32", "int64")
LARGE = 64 << 20


def _two_tasks_rank(transport) -> dict:
    """Every dtype, SUM and MEAN, and 64 MiB float32: CuPy results on GPU 0 holding NumPy's
    bytes; returns a digest per case for the ranks' comparison."""
    import cupy

    from cluster.collectives import CollectiveGroup, ReduceOp
    from cluster.settings import TaskSettings

    cupy.cuda.Device(0).use()
    group = CollectiveGroup(transport, name="check",
                            settings=TaskSettings.from_env().collectives)
    rng = np.random.default_rng(transport.rank)
    cases = [(d, op, 10_001) for d in DTYPES for op in ("SUM", "MEAN")]
    cases.append(("float32", "SUM", LARGE // 4))
    digests = {}
    for dtype, op, n in cases:
        values = (rng.standard_normal(n) * 1000).astype(dtype)
        want = group.all_reduce(values, ReduceOp[op])
        got = group.all_reduce(cupy.asarray(values), ReduceOp[op])
        if not isinstance(got, cupy.ndarray) or got.device.id != 0:
            raise AssertionError(f"{dtype} {op}: a {type(got).__name__} came back, not CuPy "
                                 "on GPU 0")
        host = cupy.asnumpy(got)
        if host.dtype != want.dtype or host.tobytes() != want.tobytes():
            raise AssertionError(f"{dtype} {op} x{n}: not the bytes of NumPy's all-reduce")
        digests[f"{dtype} {op} x{n}"] = hashlib.sha256(host.tobytes()).hexdigest()
    routes = group.route_counts
    group.close()
    return {"digests": digests, "routes": routes}


def two_tasks(path: str) -> str:
    from cluster.testing import run_group

    require_gpu()
    if path not in ("shm", "network"):
        raise SystemExit(f"two-tasks: the path is shm or network, got {path!r}")
    env = {"CLUSTER_TOKEN": os.urandom(16).hex(), "CLUSTER_DATA_PLANE": "tcp",
           "CLUSTER_COLLECTIVE_PATH": "auto" if path == "shm" else "network"}
    started = time.monotonic()
    outcomes = run_group(_two_tasks_rank, 2, timeout=240, env=env)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        last = (failed[0].traceback or "").strip().splitlines()[-1:]
        raise AssertionError(f"rank {failed[0].rank}: {last}")
    first, second = (o.result for o in outcomes)
    if first["digests"] != second["digests"]:
        raise AssertionError("the two tasks' results differ")
    routes = sorted(first["routes"])
    return (f"{len(first['digests'])} cases exact and identical on both tasks ({len(DTYPES)} "
            f"dtypes x SUM/MEAN, 64 MiB), routes {routes}, {time.monotonic() - started:.1f} s")


# -- JAX GPU arrays --------------------------------------------------------------------------------


def jax_arrays() -> str:
    require_gpu()
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        raise Skip("JAX is not installed (uv sync --inexact --extra jax; jax[cuda13] for "
                   "its GPU backend)") from e
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        raise Skip(f"JAX has no GPU backend here ({e}): install jax[cuda12] or jax[cuda13]") \
            from e
    from cluster.collectives import CollectiveGroup, ReduceOp
    from cluster.transport.inproc import InProcessHub

    hub = InProcessHub(2)
    groups = [CollectiveGroup(t) for t in hub.transports]
    inputs = [np.random.default_rng(r).standard_normal(1 << 16).astype(np.float32)
              for r in range(2)]
    results: list = [None, None]
    errors: list = []

    def rank(r: int) -> None:
        try:
            x = jax.device_put(jnp.asarray(inputs[r]), gpus[0])
            results[r] = groups[r].all_reduce(x, ReduceOp.SUM)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    want = inputs[0] + inputs[1]
    for r, out in enumerate(results):
        if not isinstance(out, jax.Array):
            raise AssertionError(f"rank {r}: a {type(out).__name__} came back, not a JAX array")
        if {d.platform for d in out.devices()} != {"gpu"}:
            raise AssertionError(f"rank {r}: the result lives on {out.devices()}, not the GPU")
        if np.asarray(out).tobytes() != want.tobytes():
            raise AssertionError(f"rank {r}: not the bytes NumPy's sum gives")
    return "JAX GPU arrays in, JAX GPU arrays out, exact, 2 ranks"


def main(argv: list[str]) -> int:
    checks = {"preflight": preflight, "mirrored": mirrored, "jax": jax_arrays,
              "two-tasks": two_tasks}
    if not argv or argv[0] not in checks:
        print(f"usage: _gpu_checks.py {{{','.join(checks)}}} [ARGS]", file=sys.stderr)
        return 2
    try:
        print(checks[argv[0]](*argv[1:]), flush=True)
    except Skip as e:
        print(e, flush=True)
        return SKIP
    except AssertionError as e:
        print(f"failed: {e}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
