"""The error hierarchy of cluster-runtime.

Every error names the task and the activity, e.g.
``PeerUnavailableError: worker:2 (127.0.0.1:41231) unreachable during all_reduce #118 after 5.0 s``.
Foreign errors (grpc.RpcError, OSError) are translated at the transport boundary and chained with
``raise ... from e``; callers classify errors by type, never by message text.
"""

from __future__ import annotations

__all__ = [
    "AddressInUseError",
    "CheckpointCorruptError",
    "ClusterError",
    "ClusterFileError",
    "ClusterSpecMismatchError",
    "ElasticGroupError",
    "CollectiveAbortedError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "PeerFailedError",
    "PeerUnavailableError",
    "PeersNotReadyError",
    "PsUnavailableError",
    "FunctionCancelledError",
    "FunctionTimeoutError",
    "OutOfRangeError",
    "RemoteFunctionError",
    "StaleStepError",
    "SyncTimeoutError",
    "TaskConfigError",
    "TransportClosedError",
    "UnauthenticatedError",
    "VariableExistsError",
    "VariableMismatchError",
    "VariableNotFoundError",
    "VariableStoreError",
]


class ClusterError(RuntimeError):
    """Base of every runtime error raised by cluster-runtime."""


class CheckpointCorruptError(ClusterError):
    """A checkpoint is unreadable: truncated, altered, missing a file, or not a checkpoint.

    ``path`` names the file (or directory) at fault; the message says what check failed.
    ``CheckpointManager.restore_or_initialize`` falls back to an older checkpoint on it.
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class PeerUnavailableError(ClusterError):
    """A peer task died, closed its port, or stopped answering heartbeats.

    ``task`` is the peer's name (``"worker:1"``) and ``address`` its ``host:port``.
    """

    def __init__(self, message: str, *, task: str = "", address: str = "") -> None:
        super().__init__(message)
        self.task = task
        self.address = address


class CollectiveTimeoutError(ClusterError, TimeoutError):
    """A collective did not complete before its deadline (``timeout_seconds``)."""


class CollectiveMismatchError(ClusterError):
    """Ranks disagree on a collective (kind, op, dtype, shape, or order of calls)."""


class CollectiveAbortedError(ClusterError):
    """Another task aborted the group; the message carries that task's root cause."""

    def __init__(self, message: str, *, task: str = "") -> None:
        super().__init__(message)
        self.task = task


class ElasticGroupError(ClusterError):
    """An elastic group cannot re-form: fewer tasks than its minimum are left (``gone``: the
    tasks that left it), this task was declared lost, or the others never came in time. The
    elastic run is over: the job fails as a non-elastic one does."""

    def __init__(self, message: str, *, gone: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.gone = gone


class UnauthenticatedError(ClusterError):
    """A peer refused our calls because the cluster token was missing or wrong."""


class TransportClosedError(ClusterError):
    """The local transport was closed while an operation was using it."""


class TaskConfigError(ClusterError, ValueError):
    """This task cannot run with the cluster it was given (strict checks at process start).

    Raised for a missing or malformed ``TF_CONFIG``, a task that is not in the cluster, an address
    that is not ``host:port``; the message names the variable, the task and how to fix it.
    """


class ClusterSpecMismatchError(TaskConfigError):
    """A peer sees a different cluster: another task answers at an address, or the group's size
    or ranks differ. Every task must be given the same cluster (the same ``TF_CONFIG`` cluster).
    """


class AddressInUseError(ClusterError, OSError):
    """A task could not bind the address its cluster spec gives it (taken, or not on this host)."""

    def __init__(self, message: str, *, task: str = "", address: str = "") -> None:
        super().__init__(message)
        self.task = task
        self.address = address


class PeersNotReadyError(PeerUnavailableError):
    """Some peers never answered a health check before the start-up deadline.

    ``missing`` lists ``(task, address, last_status)`` for each of them, in cluster order.
    """

    def __init__(self, message: str, *, missing: list[tuple[str, str, str]]) -> None:
        first_task, first_address = (missing[0][0], missing[0][1]) if missing else ("", "")
        super().__init__(message, task=first_task, address=first_address)
        self.missing = list(missing)


class PeerFailedError(ClusterError):
    """Another task reported a failure (its root cause) and this task stops because of it."""

    def __init__(self, message: str, *, task: str = "", error_type: str = "",
                 error_message: str = "", exit_code: int = 0) -> None:
        super().__init__(message)
        self.task = task
        self.error_type = error_type
        self.error_message = error_message
        self.exit_code = exit_code


class ClusterFileError(ClusterError, ValueError):
    """A cluster file (``cluster.yaml``) is unusable; ``problems`` holds every problem found.

    Each problem names the file, the line and the key, with a hint; ``str()`` lists them all.
    """

    def __init__(self, problems: list) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class VariableStoreError(ClusterError):
    """Base of the parameter-server store's errors; ``variable`` names the variable concerned."""

    def __init__(self, message: str, *, variable: str = "") -> None:
        super().__init__(message)
        self.variable = variable


class VariableNotFoundError(VariableStoreError, LookupError):
    """A parameter server holds no variable of that name (never created, or on another task)."""


class VariableExistsError(VariableStoreError, ValueError):
    """A variable was created twice with different shape, dtype, trainability or optimizer
    (or twice at all without ``exist_ok``)."""


class VariableMismatchError(VariableStoreError, ValueError):
    """A gradient or value does not fit its variable (shape, dtype), or the variable cannot take
    it (a gradient for a variable with no optimizer)."""


class StaleStepError(VariableStoreError):
    """A synchronous push arrived for a step the variable has already moved past.

    ``step`` is the pushed step, ``current_step`` the step the variable now accepts; the
    gradients were dropped, as TF1's ``SyncReplicasOptimizer`` drops stale gradients.
    """

    def __init__(self, message: str, *, variable: str = "", step: int = 0,
                 current_step: int = 0) -> None:
        super().__init__(message, variable=variable)
        self.step = step
        self.current_step = current_step


class SyncTimeoutError(VariableStoreError, TimeoutError):
    """A synchronous push waited past its deadline for the other contributors of its step; its
    own contribution was withdrawn, so pushing the same step again does not count it twice."""


class PsUnavailableError(PeerUnavailableError):
    """A parameter server died or stopped answering during parameter-server training. Its
    variables are lost: the coordinator stops (restart the job, from a checkpoint if any)."""


class FunctionCancelledError(ClusterError):
    """A function scheduled on a ClusterCoordinator was not run because an earlier one failed
    (``RemoteValue.fetch`` raises it; the failure itself is raised by ``join``/``schedule``)."""


class FunctionTimeoutError(ClusterError, TimeoutError):
    """A scheduled function ran on its worker longer than the coordinator's function timeout."""


class OutOfRangeError(ClusterError, LookupError):
    """Input ran out, as ``tf.errors.OutOfRangeError``: ``get_next()`` on an exhausted
    distributed iterator, or a scheduled function that asked a per-worker iterator for more than
    its dataset holds (``StopIteration`` on the worker). A ``LookupError`` too, as running out
    of items is."""


class RemoteFunctionError(ClusterError):
    """A scheduled function raised an exception that could not be sent back as itself (it does
    not pickle); ``error_type`` names its type, ``traceback`` is the worker's."""

    def __init__(self, message: str, *, task: str = "", error_type: str = "",
                 traceback: str = "") -> None:
        super().__init__(message)
        self.task = task
        self.error_type = error_type
        self.traceback = traceback
