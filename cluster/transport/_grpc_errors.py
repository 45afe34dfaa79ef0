"""The one module that reads ``grpc.StatusCode``: gRPC failures in, typed cluster errors out.

Clients (``ps_client``, ``worker_client``, the network transport, the control and coordination
clients) call :func:`translate` or :func:`translate_run` on a failed call, or ask the predicates
(:func:`fails_at_connect`, :func:`is_unauthenticated`, :func:`is_cancelled`) how to react;
servicers answer with :func:`abort_store_error`, :func:`abort_invalid` or
:func:`abort_unavailable`, so the status a server sends and the error a client rebuilds are
decided here, in both directions. Errors are classified by status code and by the type name a
parameter server puts in trailing metadata, never by message text.
"""

from __future__ import annotations

from typing import NoReturn

import grpc

from cluster.errors import (
    ClusterError,
    ClusterSpecMismatchError,
    FunctionTimeoutError,
    PeerUnavailableError,
    UnauthenticatedError,
)
from cluster.transport._ps_wire import ERROR_KEY, STORE_ERRORS
from cluster.transport.api import PeerInfo

__all__ = [
    "abort_exhausted",
    "abort_invalid",
    "abort_store_error",
    "abort_unavailable",
    "fails_at_connect",
    "is_cancelled",
    "is_exhausted",
    "is_unimplemented",
    "is_unauthenticated",
    "left_the_group",
    "spec_mismatch",
    "status_name",
    "translate",
    "translate_run",
]

# A call to a peer that ended like this says the peer (or the way to it) is gone.
_UNREACHABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}
# A function run that ended like this never finished on its worker: it runs again elsewhere.
# (UNKNOWN and INTERNAL come from a worker that answered: the run failed, it is not re-run.)
_RUN_LOST = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}

# The status a parameter server answers each store error with; the client reads the type name
# from trailing metadata (ERROR_KEY), the code keeps the answer meaningful to other clients.
_STORE_STATUS = {
    "VariableNotFoundError": grpc.StatusCode.NOT_FOUND,
    "VariableExistsError": grpc.StatusCode.ALREADY_EXISTS,
    "VariableMismatchError": grpc.StatusCode.INVALID_ARGUMENT,
    "StaleStepError": grpc.StatusCode.FAILED_PRECONDITION,
    "SyncTimeoutError": grpc.StatusCode.ABORTED,
}


_SPEC_HINT = ("the cluster spec differs between tasks: give every task the same cluster "
              "(TF_CONFIG's \"cluster\")")


def _code(error: BaseException) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def status_name(error: BaseException) -> str:
    """The call's status (``"UNAVAILABLE"``...), or ``"error"`` when it has none."""
    code = _code(error)
    return code.name if code is not None else "error"


def is_cancelled(error: BaseException) -> bool:
    """The call was cancelled (by us: a stream we closed)."""
    return _code(error) == grpc.StatusCode.CANCELLED


def is_exhausted(error: BaseException) -> bool:
    """The peer refused the call for one of its limits (RESOURCE_EXHAUSTED), e.g. a Pull whose
    reply would be too large: a smaller call may succeed."""
    return _code(error) == grpc.StatusCode.RESOURCE_EXHAUSTED


def is_unimplemented(error: BaseException) -> bool:
    """The peer has no such method (UNIMPLEMENTED): it predates it, and ran nothing."""
    return _code(error) == grpc.StatusCode.UNIMPLEMENTED


def is_unauthenticated(error: BaseException) -> bool:
    """The peer refused our token."""
    return _code(error) == grpc.StatusCode.UNAUTHENTICATED


def fails_at_connect(error: BaseException) -> bool:
    """A Hello or registration failure that retrying cannot cure (wrong token, another
    cluster spec)."""
    return _code(error) in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION)


def left_the_group(error: BaseException) -> bool:
    """A Hello the peer answered with ABORTED: it has left the group the caller is in (see
    :mod:`~cluster.transport.endpoint`); waiting for it is pointless."""
    return _code(error) == grpc.StatusCode.ABORTED


def spec_mismatch(message: str) -> ClusterSpecMismatchError:
    """The error for a peer that sees another cluster; ``message`` says what differs."""
    return ClusterSpecMismatchError(f"{message}: {_SPEC_HINT}")


def _details(error: grpc.RpcError) -> str:
    return error.details() if hasattr(error, "details") else str(error)


def _refused(peer: PeerInfo | str, activity: str) -> UnauthenticatedError:
    return UnauthenticatedError(
        f"{peer} refused {activity}: missing or wrong cluster token (CLUSTER_TOKEN must be the "
        "same on every task)")


def translate(error: grpc.RpcError, peer: PeerInfo | str, activity: str, *,
              seconds: float | None = None) -> ClusterError:
    """A typed error naming ``peer`` (a :class:`PeerInfo`, or a task's description) and
    ``activity`` for a failed call to that peer.

    A parameter server's store error comes back as its own type; a refused token is
    :class:`UnauthenticatedError`; a peer that refused us because it was given another cluster
    (FAILED_PRECONDITION) :class:`ClusterSpecMismatchError`; a dead, unreachable or too slow
    peer is :class:`PeerUnavailableError` (``seconds``: the call's deadline, named in the
    message); anything else :class:`ClusterError`.
    """
    code, details = _code(error), _details(error)
    metadata = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    names = [v for k, v in (metadata or ()) if k == ERROR_KEY]
    if names and names[0] in STORE_ERRORS:
        return STORE_ERRORS[names[0]](f"{peer}: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return _refused(peer, activity)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return spec_mismatch(f"{peer} refused {activity}: {details}")
    if code in _UNREACHABLE or code is None:
        name = code.name if code is not None else "error"
        after = f" after {seconds:.1f} s" if seconds is not None else ""
        task = peer.task if isinstance(peer, PeerInfo) else peer
        address = peer.address if isinstance(peer, PeerInfo) else ""
        return PeerUnavailableError(f"{peer} unreachable during {activity}{after}: {name}: "
                                    f"{details}", task=task, address=address)
    return ClusterError(f"{peer} failed {activity}: {code.name}: {details}")


def translate_run(error: grpc.RpcError, peer: PeerInfo, activity: str, *,
                  seconds: float, setting: str) -> ClusterError:
    """:func:`translate` for a worker's ``Run`` of a function (``activity``, "function #3").

    :class:`PeerUnavailableError` means the run was lost with its worker (run it elsewhere);
    a run past its ``seconds`` deadline is :class:`FunctionTimeoutError` naming ``setting``, the
    variable that sets it; a refused token :class:`UnauthenticatedError`; else
    :class:`ClusterError` (the worker answered: the run failed).
    """
    code, details = _code(error), _details(error)
    if code in _RUN_LOST:
        return PeerUnavailableError(f"{peer} lost {activity}: {code.name}: {details}",
                                    task=peer.task, address=peer.address)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return FunctionTimeoutError(
            f"{activity} ran on {peer.task} for more than {seconds:g} s ({setting})")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return _refused(peer, activity)
    name = code.name if code is not None else "error"
    return ClusterError(f"{peer.task} failed to run {activity}: {name}: {details}")


# -- server side ------------------------------------------------------------------------------


def abort_store_error(context: grpc.ServicerContext, error: Exception) -> NoReturn:
    """End a call with the status of store error ``error`` and its type name in trailing
    metadata (:func:`translate` rebuilds the type on the client)."""
    context.set_trailing_metadata(((ERROR_KEY, type(error).__name__),))
    context.abort(_STORE_STATUS.get(type(error).__name__, grpc.StatusCode.INVALID_ARGUMENT),
                  str(error))
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def abort_invalid(context: grpc.ServicerContext, message: str) -> NoReturn:
    """End a call whose request is malformed (INVALID_ARGUMENT); the server keeps serving."""
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def abort_exhausted(context: grpc.ServicerContext, message: str) -> NoReturn:
    """End a call refused for one of the server's limits (RESOURCE_EXHAUSTED); it keeps
    serving, and a smaller call may succeed (:func:`is_exhausted`)."""
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def abort_unavailable(context: grpc.ServicerContext, message: str) -> NoReturn:
    """End a call the task cannot serve yet (UNAVAILABLE): a client treats it as not there."""
    context.abort(grpc.StatusCode.UNAVAILABLE, message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover
