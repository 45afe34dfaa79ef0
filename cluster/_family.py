"""Array families, the one adapter of strategies and collectives alike: NumPy, CuPy, Python
scalars and lists, and anything exporting DLPack.

Strategies and collectives compute on NumPy (host) or CuPy (GPU) arrays. :func:`to_array` brings
a user's value into one of those without a copy where the library allows (DLPack,
``np.asarray``), and returns how to hand a result back in the caller's family (a torch tensor
comes back as a torch tensor, a Python or NumPy scalar as a NumPy scalar). :func:`stage` is the
same for code that needs host memory (the collectives' host algorithms): a CuPy array is copied to
the host and its result copied back onto its GPU. :func:`to_host` / :func:`on_device_of` are the
two copies themselves; given a :class:`~cluster._staging.Staging`, they go through its pinned,
reused buffers and copy streams (the collective groups' way), else through pageable memory.

:func:`family_of` decides a value's family once, where it enters a strategy, as a :class:`Family`
(the array module, the GPU, the way back) that is carried down with its arrays instead of being
decided again at every layer.

One dtype rule everywhere, TensorFlow's (``tf.convert_to_tensor``, which ``all_reduce`` applies
to a Python value): ``float`` -> float32, ``int`` -> int32 (int64 when it does not fit), ``bool``
-> bool; NumPy values keep their dtype. CuPy is never imported here: a CuPy array exists only once
the user imported ``cupy``, so ``sys.modules`` is where to find it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from cluster._staging import Staging

__all__ = [
    "Family",
    "Staged",
    "asarray_like_tf",
    "family_of",
    "is_cupy",
    "on_device_of",
    "restore_for",
    "stage",
    "to_array",
    "to_host",
    "xp_of",
]


def _cupy() -> Any:
    # CuPy is never imported here: a CuPy array exists only once the user imported cupy.
    return sys.modules.get("cupy")


def is_cupy(value: Any) -> bool:
    cupy = _cupy()
    return cupy is not None and isinstance(value, cupy.ndarray)


def xp_of(value: Any) -> Any:
    """The array module (numpy or cupy) that computes on ``value``."""
    return _cupy() if is_cupy(value) else np


def asarray_like_tf(value: Any, dtype: Any = None) -> np.ndarray:
    """``value`` as a NumPy array with TensorFlow's dtype inference for Python values.

    Python floats (and lists of them) become float32, Python ints int32, bools bool; NumPy
    arrays and scalars keep their dtype unless ``dtype`` is given.
    """
    if dtype is not None:
        return np.asarray(value, dtype=np.dtype(dtype))
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    array = np.asarray(value)
    if array.dtype == np.float64:
        return array.astype(np.float32)
    if array.dtype == np.int64:
        if array.size and (array.max() > np.iinfo(np.int32).max
                           or array.min() < np.iinfo(np.int32).min):
            return array  # TF would make it int64 too when it does not fit
        return array.astype(np.int32)
    if array.dtype.kind in "OUS":
        raise TypeError(
            f"expected a number, an array or a nest of them, got {type(value).__name__} "
            f"{value!r:.80}; convert it to a NumPy array first"
        )
    return array


def _identity(result: Any) -> Any:
    return result


def _scalar(result: Any) -> Any:
    # A scalar in, a NumPy scalar out (as NumPy's own operations on scalars return).
    return result[()] if getattr(result, "ndim", None) == 0 and isinstance(result, np.ndarray) \
        else result


def to_array(value: Any, what: str = "") -> tuple[Any, Callable[[Any], Any]]:
    """``(array, restore)``: ``value`` as a NumPy or CuPy array, and the way back to its family.

    NumPy/CuPy arrays and DLPack exporters are viewed, not copied; Python values follow the
    module's dtype rule. Raises ``TypeError`` naming the supported families (and ``what``, the
    calling operation, when given) for anything else.
    """
    if isinstance(value, np.ndarray) or is_cupy(value):
        return value, _identity
    if isinstance(value, (np.generic, int, float, bool)) or (
        isinstance(value, (list, tuple)) and not hasattr(value, "__dlpack__")
    ):
        return asarray_like_tf(value), _scalar if not isinstance(value, (list, tuple)) \
            else _identity
    if hasattr(value, "__dlpack__") or _is_jax(value):
        return _from_dlpack(value)
    raise TypeError(
        f"{what + ' ' if what else ''}got a value of type {type(value).__module__}."
        f"{type(value).__qualname__}; supported: "
        "NumPy arrays and scalars, Python numbers, CuPy arrays, and arrays exporting DLPack "
        "(__dlpack__, e.g. torch tensors). Convert it first, e.g. np.asarray(value)"
    )


@dataclass(frozen=True)
class Family:
    """A value's array family, decided once where it enters a strategy (:func:`family_of`).

    - ``xp``: the array module that computes on its arrays (``numpy`` or ``cupy``);
    - ``device``: the GPU of a CuPy value, ``None`` in host memory;
    - ``restore``: turns a NumPy/CuPy result of the same shape back into the caller's family
      (a torch tensor comes back a torch tensor, a Python number a NumPy scalar).
    """

    xp: Any
    device: int | None
    restore: Callable[[Any], Any]

    @property
    def on_gpu(self) -> bool:
        return self.device is not None


def family_of(value: Any, what: str = "") -> tuple[Any, Family]:
    """``(array, family)``: ``value`` as :func:`to_array` views it, and its :class:`Family`.

    Raises ``TypeError`` as :func:`to_array` does for a value of no supported family.
    """
    array, restore = to_array(value, what)
    if is_cupy(array):
        return array, Family(_cupy(), array.device.id, restore)
    return array, Family(np, None, restore)


def _from_dlpack(value: Any) -> tuple[Any, Callable[[Any], Any]]:
    device_type = value.__dlpack_device__()[0] if hasattr(value, "__dlpack_device__") else 1
    cupy = _cupy()
    try:
        if device_type != 1:  # not kDLCPU
            if cupy is None:
                raise TypeError("a GPU array needs CuPy installed to be used here")
            array = cupy.from_dlpack(value)
        elif _is_jax(value):
            # NumPy reads a JAX CPU array without DLPack, bfloat16 included (JAX brings
            # ml_dtypes), and without a copy where JAX allows.
            array = np.asarray(value)
        elif _is_bfloat16_tensor(value):
            # DLPack cannot carry bfloat16 into NumPy: view the bits as int16, then as
            # ml_dtypes' bfloat16 (no copy).
            array = np.from_dlpack(value.view(sys.modules["torch"].int16)).view(_bfloat16())
        else:
            array = np.from_dlpack(value)
    except (BufferError, RuntimeError) as e:
        raise TypeError(_dlpack_hint(value, e)) from e
    return array, restore_for(value)


def _dlpack_hint(value: Any, error: BaseException) -> str:
    """Why ``value`` cannot be viewed, and what to do: the advice depends on the cause."""
    name = type(value).__qualname__
    if getattr(value, "requires_grad", False):
        return (f"cannot view a {name} that requires grad ({error}); pass tensor.detach() "
                "(or p.grad for a parameter's gradient)")
    dtype = getattr(value, "dtype", "?")
    return (f"cannot view a {name} of dtype {dtype} as an array ({error}); the collectives "
            "take float16, float32, float64, int32, int64 and bfloat16 (bfloat16 needs the "
            "ml_dtypes package). Cast it first, e.g. tensor.float()")


def _is_jax(value: Any) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.Array)


def _is_bfloat16_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16


def _bfloat16() -> Any:
    try:
        import ml_dtypes  # optional: bfloat16 exists for NumPy only through it
    except ImportError as e:
        raise TypeError(
            "a bfloat16 tensor needs the ml_dtypes package (pip install ml_dtypes, or the "
            "'torch' extra) to be reduced; or cast it first, e.g. tensor.float()"
        ) from e
    return ml_dtypes.bfloat16


def restore_for(value: Any) -> Callable[[Any], Any]:
    """The way from a NumPy/CuPy result back into ``value``'s family.

    Same shape (0-d stays 0-d) and dtype. JAX arrays come back as JAX arrays
    (``jax.numpy.asarray``), torch tensors as torch tensors (``torch.from_dlpack``, bfloat16
    through an int16 view), other DLPack exporters through their package's ``from_dlpack``.
    """
    if isinstance(value, np.ndarray) or is_cupy(value):
        return _identity
    if isinstance(value, (np.generic, int, float, bool)):
        return _scalar
    if _is_jax(value):
        return sys.modules["jax"].numpy.asarray
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _to_torch
    package = sys.modules.get(type(value).__module__.split(".")[0])
    from_dlpack = getattr(package, "from_dlpack", None)
    if from_dlpack is None or not hasattr(value, "__dlpack__"):
        return _identity

    def restore(result: Any) -> Any:
        return from_dlpack(_c_contiguous(result))

    return restore


def _c_contiguous(result: Any) -> Any:
    # Not np.ascontiguousarray: it turns a 0-d array into shape (1,).
    return result if result.flags.c_contiguous else xp_of(result).ascontiguousarray(result)


def _to_torch(result: Any) -> Any:
    torch = sys.modules["torch"]
    result = _c_contiguous(result)
    if result.dtype.name == "bfloat16":
        return torch.from_dlpack(result.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(result)


def to_host(array: Any, staging: Staging | None = None) -> np.ndarray:
    """A NumPy or CuPy ``array`` in host memory: NumPy as is, CuPy copied off its GPU.

    With ``staging``, the copy is one of its pinned pool buffers (or pageable memory when none
    fits), the caller's to read and write until it drops it; without, fresh pageable memory.
    """
    if not is_cupy(array):
        return np.asarray(array)
    if staging is not None:
        return staging.to_host(array)
    return sys.modules["cupy"].asnumpy(array)


def on_device_of(template: Any, host: np.ndarray, staging: Staging | None = None) -> Any:
    """``host`` on ``template``'s GPU (a fresh copy, ready on return) when ``template`` is a
    CuPy array, else ``host``. ``staging`` makes the copy on its stream (fast from its pinned
    buffers); ``host`` may be reused once this returns either way."""
    if not is_cupy(template):
        return host
    return _to_device(host, template.device.id, staging)


def _to_device(host: np.ndarray, device: int, staging: Staging | None) -> Any:
    if staging is not None:
        return staging.to_device(np.asarray(host), device)
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(device):
        # From pageable memory, CuPy copies ``host`` into a transfer buffer before returning.
        return cupy.asarray(host)


@dataclass(frozen=True)
class Staged:
    """A value staged in host memory for a collective's host algorithms.

    - ``array``: the value as a NumPy array (any memory layout).
    - ``owned``: True when ``array`` is a fresh copy nobody else can see (a converted scalar or
      list, a CuPy array's host copy), so a collective may reduce into it in place.
    - ``restore``: turns a host result of the same shape back into the caller's family (onto
      the caller's GPU for a CuPy value: a fresh CuPy array, ready on return; the host result
      may be reused once it returns).
    """

    array: np.ndarray
    owned: bool
    restore: Callable[[np.ndarray], Any]


def stage(value: Any, what: str = "collective", staging: Staging | None = None) -> Staged:
    """``value`` (any family :func:`to_array` takes) staged in host memory.

    A GPU value is copied to the host (through ``staging``'s pinned buffers when given, see
    :func:`to_host`) and its result back onto its GPU. Raises ``TypeError`` naming ``what`` and
    the supported families for anything else.
    """
    array, restore = to_array(value, what)
    if is_cupy(array):
        return Staged(to_host(array, staging), True, _back_to(array, restore, staging))
    owned = array is not value and not hasattr(value, "__dlpack__")  # converted: a fresh array
    return Staged(array, owned, restore)


def _back_to(device_array: Any, restore: Callable[[Any], Any],
             staging: Staging | None) -> Callable[[np.ndarray], Any]:
    device = device_array.device.id

    def back(result: np.ndarray) -> Any:
        return restore(_to_device(result, device, staging))

    return back
