"""The variable store of one parameter-server task: a pure, thread-safe state machine.

No sockets, no gRPC: ``ps/servicer.py`` wraps it for the wire, tests drive it directly. The
synchronous accumulator lives in :mod:`cluster.ps._sync_accumulator`.

- :meth:`VariableStore.create` a variable (a whole one, or one shard ``"name/part_1"``) with an
  optional :class:`OptimizerSpec`; its slots (momentum, Adam's ``m``/``v``) live next to it. A
  variable created without one adopts the optimizer of the first push that names one (as in
  Keras, the model's variables exist before the optimizer); it can never change afterwards.
- :meth:`~VariableStore.pull` copies of values with their versions (``pull_with``: copies made
  by the caller, for a servicer that encodes them for the wire in that one copy).
- :meth:`~VariableStore.push` gradients. Asynchronous mode (``num_contributors=1``): the optimizer
  is applied at once, per variable. Synchronous mode (``num_contributors=N > 1``, like TF1's
  ``SyncReplicasOptimizer``): the gradients of step ``step`` are accumulated until ``N``
  contributions for that step arrived, then their **mean** is applied once, as TF1's
  ``ConditionalAccumulator`` does: each contributor's loss is the mean over its own batch, so the
  mean of the ``N`` gradients is the gradient of the mean loss over the global batch. The mean is
  bitwise reproducible: the contributions are summed in contributor order (arrival order for
  pushes without a contributor index) into a copy, which is then divided by ``N`` once. A push
  with a ``contributor`` index (a coordinator's) replaces that contributor's earlier push for the
  same pending step, and re-pushing the step just applied changes nothing, so a function re-run
  after its worker died mid-push is harmless; such a step is applied on the variable's next use,
  so the re-run still reads the values as of its step (``pull(step=...)``).
- :meth:`~VariableStore.assign` ``ASSIGN``/``ASSIGN_ADD``/``ASSIGN_SUB``.

Every update (an optimizer step, an assign) increments the variable's ``version`` by one;
creation gives version 1, so ``newer_than=0`` always matches. Concurrency: each variable has its
own lock, so pushes to different variables proceed in parallel and each update of one variable
is atomic; a push of several variables is *not* atomic across them (as in TF's asynchronous
parameter-server training). Lock order: the store lock, then a variable's lock, never reversed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from cluster._ps_values import AssignMode, OptimizerSpec, Pulled
from cluster._update_rules import adam_update, sgd_update
from cluster.deadline import Deadline
from cluster.errors import (
    VariableExistsError,
    VariableMismatchError,
    VariableNotFoundError,
)
from cluster.ps._pieces import GradientPieces
from cluster.ps._sync_accumulator import Pending, SyncAccumulator

__all__ = ["SYNC_WAIT_SECONDS", "AssignMode", "OptimizerSpec", "Pulled", "VariableStore"]
# AssignMode, OptimizerSpec and Pulled are the store's value types (cluster._ps_values); they
# stay importable from here and from cluster.ps.

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a synchronous push waits for its step when the caller gives no deadline.
SYNC_WAIT_SECONDS = 300.0


@dataclass(eq=False)
class _Variable:
    name: str
    value: np.ndarray
    trainable: bool
    optimizer: OptimizerSpec | None  # set once (at creation or by adoption), never changed
    slots: dict[str, np.ndarray]
    version: int = 1
    iterations: int = 0  # optimizer updates applied (Adam's t)
    sync_step: int = 0  # the oldest step a synchronous push may still contribute to
    # The contributor indices of step sync_step - 1 (empty when it was pushed unindexed).
    applied_by: frozenset[int] = frozenset()
    # step -> its contributions; guarded by the store lock.
    pending: dict[int, Pending] = field(default_factory=dict)
    # The complete step whose application is deferred (cluster.ps._sync_accumulator); written
    # under the store lock, read without it by _settle.
    due: int | None = None
    # (step, version, value) before a deferred step that a read applied early, or None.
    before: tuple[int, int, np.ndarray] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def meta(self) -> tuple:
        return (self.value.shape, self.value.dtype, self.trainable, self.optimizer)

    def adopt(self, optimizer: OptimizerSpec) -> None:
        """Take ``optimizer`` and create its zero slots; the caller holds the store lock and
        ``self.lock`` and has checked that the variable has none and is floating-point."""
        self.slots = {s: np.zeros_like(self.value) for s in optimizer.slot_names}
        self.optimizer = optimizer

    def describe_meta(self) -> str:
        return (f"shape={self.value.shape}, dtype={self.value.dtype}, trainable={self.trainable},"
                f" optimizer={self.optimizer}")


class VariableStore:
    """Variables, their optimizer slots and versions on one parameter-server task.

    ``task`` (``"ps:0"``) only names this store in error messages. Every method is thread-safe.
    """

    def __init__(self, task: str = "") -> None:
        self.task = task
        self._lock = threading.Lock()
        self._vars: dict[str, _Variable] = {}
        self._sync = SyncAccumulator(self._lock, self._where, self._apply)

    def _where(self) -> str:
        return f" on {self.task}" if self.task else ""

    # ---- create / inspect ---------------------------------------------------------------

    def create(self, name: str, initial_value: Any, *, trainable: bool = True,
               optimizer: OptimizerSpec | None = None, exist_ok: bool = False) -> int:
        """Create variable ``name`` holding a copy of ``initial_value``; returns its version.

        With ``exist_ok`` an existing variable of the same shape, dtype and trainability is kept
        as it is (its current version is returned): a restarted coordinator may create its
        variables again. ``optimizer=None`` matches any optimizer the variable has (it may have
        adopted one from a push); given, it must equal the variable's, or is adopted by a
        variable that has none. Raises :class:`VariableExistsError` otherwise, and
        ``ValueError`` for an empty name or an optimizer on a non-float variable.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"variable name must be a non-empty string, got {name!r}")
        value = np.array(initial_value, copy=True, order="C")
        if optimizer is not None and not np.issubdtype(value.dtype, np.floating):
            raise ValueError(f"variable {name}: an optimizer needs a floating-point variable, "
                             f"got dtype {value.dtype}")
        slots = {s: np.zeros_like(value) for s in optimizer.slot_names} if optimizer else {}
        new = _Variable(name, value, bool(trainable), optimizer, slots)
        with self._lock:
            old = self._vars.get(name)
            if old is None:
                self._vars[name] = new
                return new.version
            fits = old.meta()[:3] == new.meta()[:3] and (
                optimizer is None or old.optimizer in (None, optimizer))
            if not exist_ok or not fits:
                why = ("already exists" if fits and not exist_ok
                       else f"already exists with {old.describe_meta()}")
                raise VariableExistsError(
                    f"variable {name}{self._where()} {why}; create({new.describe_meta()}"
                    f", exist_ok={exist_ok}) refused", variable=name)
            with old.lock:
                if old.optimizer is None and optimizer is not None:
                    old.adopt(optimizer)
                return old.version

    def _get(self, name: str) -> _Variable:
        var = self._vars.get(name)  # dict reads are atomic; entries are never removed
        if var is None:
            raise VariableNotFoundError(f"no variable {name!r}{self._where()}", variable=name)
        return var

    def _settled(self, name: str, before: int | None = None) -> _Variable:
        """:meth:`_get`, after applying the variable's deferred synchronous step if it is older
        than ``before`` (``None``: any; see :mod:`cluster.ps._sync_accumulator`)."""
        var = self._get(name)
        self._settle(var, before)
        return var

    def _settle(self, var: _Variable, before: int | None) -> None:
        due = var.due  # read without the lock: a step completing just after is not yet visible,
        # as if this call had come first; only a due step takes the store lock
        if due is not None and (before is None or due < before):
            with self._lock:
                self._sync.settle(var, before)

    def names(self) -> list[str]:
        """Names of every variable, in creation order."""
        with self._lock:
            return list(self._vars)

    def __contains__(self, name: object) -> bool:
        return name in self._vars

    def nbytes(self, name: str) -> int:
        """The size in bytes of variable ``name``'s value (fixed at creation)."""
        return self._get(name).value.nbytes

    def version(self, name: str) -> int:
        var = self._settled(name)
        with var.lock:
            return var.version

    def slot(self, name: str, slot: str) -> np.ndarray:
        """A copy of optimizer slot ``slot`` (``"momentum"``, ``"m"``, ``"v"``) of ``name``."""
        var = self._settled(name)
        with var.lock:
            if slot not in var.slots:
                raise VariableNotFoundError(f"variable {name}{self._where()} has no slot "
                                            f"{slot!r} (slots: {sorted(var.slots)})", variable=name)
            return var.slots[slot].copy()

    def read_slots(self, name: str) -> tuple[OptimizerSpec | None, int, dict[str, np.ndarray]]:
        """``(optimizer, iterations, {slot: copy})`` of variable ``name``, read atomically (for
        checkpoints). Raises :class:`VariableNotFoundError`."""
        var = self._settled(name)
        with var.lock:
            return var.optimizer, var.iterations, {s: a.copy() for s, a in var.slots.items()}

    def write_slots(self, name: str, optimizer: OptimizerSpec, *, iterations: int | None = None,
                    slots: Mapping[str, Any] | None = None) -> None:
        """Set some of ``name``'s optimizer state (restoring a checkpoint): the ``slots`` given
        and ``iterations`` when not ``None``. A variable without an optimizer adopts
        ``optimizer`` first. Value, version and other slots are unchanged. Raises
        :class:`VariableNotFoundError`, :class:`VariableMismatchError` (another optimizer, a slot
        it has not, a wrong shape or dtype), ``ValueError`` for negative ``iterations``.
        """
        if iterations is not None and int(iterations) < 0:
            raise ValueError(f"write_slots: iterations must be >= 0, got {iterations}")
        var = self._settled(name)
        self._check_optimizer(var, optimizer)
        with self._lock:  # adoption happens under the store lock (see _adopt)
            if var.optimizer is None:
                self._check_optimizer(var, optimizer)
                with var.lock:
                    var.adopt(optimizer)
        slots = dict(slots or {})
        for slot in slots:
            if slot not in var.slots:
                raise VariableMismatchError(
                    f"variable {name}{self._where()} has no slot {slot!r} (slots: "
                    f"{sorted(var.slots)})", variable=name)
        arrays = {s: self._coerce(var, v, f"slot {s}") for s, v in slots.items()}
        with var.lock:
            for slot, array in arrays.items():
                np.copyto(var.slots[slot], array)
            if iterations is not None:
                var.iterations = int(iterations)

    # ---- pull -----------------------------------------------------------------------------

    def pull(self, names: Iterable[str], newer_than: int | Sequence[int] | None = None, *,
             step: int | None = None) -> list[Pulled]:
        """Copies of the named variables, in the order asked, each with its version.

        ``newer_than`` (one version for all, or one per name; ``None`` or 0: always) leaves out
        a variable whose version is not newer. ``step``: the synchronous step the reader
        computes (a coordinator's function): the values *as of* that step, before its update,
        even where every contribution to it has arrived (so a function re-run after its worker
        died reads what the first run read); ``None``: the latest values, every complete step
        applied. Raises :class:`VariableNotFoundError`, ``ValueError`` for a negative ``step``
        or mismatched ``newer_than``.
        """
        return self.pull_with(names, newer_than,
                              lambda name, version, value: Pulled(name, version, value.copy()),
                              step=step)

    def pull_with(self, names: Iterable[str], newer_than: int | Sequence[int] | None,
                  read: Callable[[str, int, np.ndarray], T], *,
                  step: int | None = None) -> list[T]:
        """:meth:`pull`, with ``read(name, version, value)`` making what leaves the store.

        ``read`` runs under the variable's lock with the live value: it must copy what it keeps
        (a servicer encodes the value straight into its reply, one copy instead of two) and must
        not call the store. Its results are returned in the order asked.
        """
        if step is not None and (isinstance(step, bool) or not isinstance(step, (int, np.integer))
                                 or step < 0):
            raise ValueError(f"pull: step must be an int >= 0 or None, got {step!r}")
        names = list(names)
        if newer_than is None or isinstance(newer_than, (int, np.integer)):
            thresholds = [int(newer_than or 0)] * len(names)
        else:
            thresholds = [int(t) for t in newer_than]
            if len(thresholds) != len(names):
                raise ValueError(f"pull: {len(names)} names but {len(thresholds)} versions in "
                                 "newer_than")
        variables = [self._get(n) for n in names]
        out = []
        for var, threshold in zip(variables, thresholds, strict=True):
            self._settle(var, step)
            with var.lock:
                version, value = var.version, var.value
                kept = var.before
                if step is not None and kept is not None and kept[0] == step \
                        and var.sync_step == step + 1:
                    _, version, value = kept  # a read applied the step early: as of before it
                if version > threshold:
                    out.append(read(var.name, version, value))
        return out

    # ---- assign ---------------------------------------------------------------------------

    def _coerce(self, var: _Variable, value: Any, what: str) -> np.ndarray:
        """``value`` as an array of ``var``'s shape and dtype; Python values are converted,
        arrays must already have the dtype (no silent precision changes)."""
        if isinstance(value, np.ndarray):
            array = value
        else:
            try:
                array = np.asarray(value, dtype=var.value.dtype)
            except (TypeError, ValueError) as e:
                raise VariableMismatchError(f"{what} for variable {var.name}{self._where()} is "
                                            f"not a {var.value.dtype} array: {e}",
                                            variable=var.name) from e
        self._check_like(var, array.shape, array.dtype, what)
        return array

    def _check_like(self, var: _Variable, shape: tuple[int, ...], dtype: np.dtype,
                    what: str) -> None:
        """Raise :class:`VariableMismatchError` unless ``shape`` and ``dtype`` are ``var``'s."""
        if shape != var.value.shape or dtype != var.value.dtype:
            raise VariableMismatchError(
                f"{what} of shape {shape} and dtype {dtype} for variable {var.name}"
                f"{self._where()} of shape {var.value.shape} and dtype {var.value.dtype}",
                variable=var.name)

    def assign(self, name: str, value: Any, mode: AssignMode = AssignMode.ASSIGN) -> int:
        """Set (``ASSIGN``), add to or subtract from variable ``name``; returns the new version.

        Slots and optimizer step count are unchanged. Raises :class:`VariableNotFoundError`,
        :class:`VariableMismatchError`.
        """
        mode = AssignMode(mode)
        var = self._settled(name)
        array = self._coerce(var, value, mode.name.lower() + " value")
        with var.lock:
            if mode is AssignMode.ASSIGN:
                np.copyto(var.value, array)
            elif mode is AssignMode.ASSIGN_ADD:
                var.value += array
            else:
                var.value -= array
            var.version += 1
            return var.version

    # ---- push -----------------------------------------------------------------------------

    def _check_grads(self, grads: Mapping[str, Any],
                     optimizer: OptimizerSpec | None) -> list[tuple[_Variable, np.ndarray]]:
        if not grads:
            raise ValueError("push: no gradients")
        checked = []
        for name, grad in grads.items():
            var = self._get(name)
            if not var.trainable:
                raise VariableMismatchError(f"gradient pushed for variable {name}{self._where()}, "
                                            "which is not trainable", variable=name)
            self._check_optimizer(var, optimizer)
            if isinstance(grad, GradientPieces):
                self._check_like(var, grad.shape, grad.dtype, "gradient")
                checked.append((var, grad))
            else:
                checked.append((var, self._coerce(var, grad, "gradient")))
        return checked

    def _check_optimizer(self, var: _Variable, optimizer: OptimizerSpec | None) -> None:
        """Raise unless a push naming ``optimizer`` (or none) may update ``var``.

        A variable's optimizer goes from ``None`` to a spec once and never changes, so a check
        that passes against a spec stays true; one against ``None`` is repeated under the store
        lock before adopting (:meth:`_adopt`).
        """
        current = var.optimizer
        if current is None:
            if optimizer is None:
                raise VariableMismatchError(
                    f"gradient pushed for variable {var.name}{self._where()}, which has no "
                    "optimizer (create it with one, or push with optimizer=...)",
                    variable=var.name)
            if not np.issubdtype(var.value.dtype, np.floating):
                raise VariableMismatchError(
                    f"variable {var.name}{self._where()} of dtype {var.value.dtype} cannot take "
                    f"optimizer {optimizer}: an optimizer needs a floating-point variable",
                    variable=var.name)
        elif optimizer is not None and optimizer != current:
            raise VariableMismatchError(
                f"push with optimizer {optimizer} for variable {var.name}{self._where()}, which "
                f"has optimizer {current}", variable=var.name)

    def _adopt(self, checked: list[tuple[_Variable, np.ndarray]],
               optimizer: OptimizerSpec | None) -> None:
        """Give ``optimizer`` to the variables of ``checked`` that have none; the caller holds
        the store lock. Checks all before changing any, so a refused push changes nothing."""
        adopting = [var for var, _ in checked if var.optimizer is None]
        if not adopting:
            return
        for var in adopting:  # again: a concurrent push may have given it another meanwhile
            self._check_optimizer(var, optimizer)
        assert optimizer is not None
        for var in adopting:
            with var.lock:
                var.adopt(optimizer)
            log.debug("variable %s%s adopted optimizer %s", var.name, self._where(), optimizer)

    def _apply(self, var: _Variable, grad: np.ndarray | GradientPieces) -> int:
        """One optimizer update of ``var``; the caller holds ``var.lock``. A gradient in
        pieces is applied a piece at a time to the matching elements of the variable and its
        slots: the rules are elementwise, so the bytes are those of one update."""
        spec = var.optimizer
        assert spec is not None
        var.iterations += 1
        if isinstance(grad, GradientPieces):
            # The store's values and slots are its own C-contiguous arrays: reshape is a view.
            value = var.value.reshape(-1)
            slots = {k: v.reshape(-1) for k, v in var.slots.items()}
            for start, flat in grad.pieces:
                end = start + flat.size
                self._rule(spec, var.iterations, value[start:end], flat,
                           {k: v[start:end] for k, v in slots.items()})
        else:
            self._rule(spec, var.iterations, var.value, grad, var.slots)
        var.version += 1
        return var.version

    @staticmethod
    def _rule(spec: OptimizerSpec, iteration: int, value: np.ndarray, grad: np.ndarray,
              slots: Mapping[str, np.ndarray]) -> None:
        if spec.rule == "sgd":
            sgd_update(value, grad, slots.get("momentum"), learning_rate=spec.learning_rate,
                       momentum=spec.momentum, nesterov=spec.nesterov)
        else:
            adam_update(value, grad, slots["m"], slots["v"], learning_rate=spec.learning_rate,
                        beta_1=spec.beta_1, beta_2=spec.beta_2, epsilon=spec.epsilon,
                        iteration=iteration)

    def push(self, grads: Mapping[str, Any], *, step: int | None = None,
             num_contributors: int = 1, contributor: int | None = None, wait: bool = True,
             optimizer: OptimizerSpec | None = None,
             deadline: Deadline | None = None) -> list[int]:
        """Apply (or contribute) gradients; returns each variable's version, in ``grads`` order.

        Every gradient is checked before any is used, so a refused push changes nothing. A
        gradient is an array or a :class:`~cluster.ps._pieces.GradientPieces` (a ``PushChunks``
        stream's, applied piece by piece without joining; joined for a synchronous push).
        ``optimizer``: a variable that has none adopts it (its zero slots are created); one that
        has an optimizer must have this one. Without it, every variable needs an optimizer.

        Asynchronous (``num_contributors == 1`` and no ``contributor``): each variable is
        updated at once.

        Synchronous (``num_contributors > 1``, or a ``contributor`` given; ``step`` required):
        the **mean** of the ``num_contributors`` contributions to ``step`` is applied once, when
        the last one arrives (summed in contributor order, or arrival order for unindexed
        pushes, then divided by the count: bitwise reproducible). The variable then accepts
        ``step + 1`` and later; contributions still pending for older steps are dropped, with a
        warning in the log (their waiting pushers get :class:`StaleStepError`).

        - ``contributor=None``: each push is a distinct contribution; a contributor must push a
          step once.
        - ``contributor=k`` (``0 <= k < num_contributors``): contributions are keyed by ``k``. A
          second push by ``k`` for a pending step replaces the first (whose pusher, if still
          waiting, gets :class:`StaleStepError`); the step applies when every index has pushed.
          A push by ``k`` for the step just applied (``step == current step - 1``), to which
          ``k`` contributed, changes nothing and returns the current versions: a function
          re-run after its worker died mid-push is harmless. Indexed and unindexed pushes
          cannot be mixed in one step (``ValueError``).

        With ``wait`` the call returns when every variable pushed has applied ``step`` (versions
        after that update); on ``deadline`` (default :data:`SYNC_WAIT_SECONDS` from the call)
        its contribution is withdrawn and :class:`SyncTimeoutError` raised. Without ``wait`` it
        returns as soon as the contribution is recorded (versions as they are then). A step
        completed by indexed pushes none of which waits is applied on the variable's next use
        other than a read as of that step (:meth:`pull` with ``step``), so that a re-run of one
        of its functions reads what the first run read (:mod:`cluster.ps._sync_accumulator`).

        Raises :class:`VariableNotFoundError`, :class:`VariableMismatchError` (shape, dtype,
        untrainable, no optimizer, a different optimizer), :class:`StaleStepError` (``step``
        older than a variable's current step, and not an idempotent re-push),
        :class:`SyncTimeoutError`, ``ValueError`` for bad arguments.
        """
        if isinstance(num_contributors, bool) or not isinstance(num_contributors, int) \
                or num_contributors < 1:
            raise ValueError(f"num_contributors must be an int >= 1, got {num_contributors!r}")
        if contributor is not None and (
                isinstance(contributor, bool) or not isinstance(contributor, (int, np.integer))
                or not 0 <= contributor < num_contributors):
            raise ValueError(f"contributor must be an int in [0, {num_contributors}) "
                             f"(num_contributors={num_contributors}), got {contributor!r}")
        if optimizer is not None and not isinstance(optimizer, OptimizerSpec):
            raise TypeError(f"optimizer must be an OptimizerSpec or None, got "
                            f"{type(optimizer).__name__}")
        checked = self._check_grads(grads, optimizer)
        if num_contributors == 1 and contributor is None:
            for var, _ in checked:
                self._settle(var, None)
            if any(var.optimizer is None for var, _ in checked):
                with self._lock:
                    self._adopt(checked, optimizer)
            versions = []
            for var, grad in checked:
                with var.lock:
                    versions.append(self._apply(var, grad))
            return versions
        # A synchronous contribution is kept until its step completes: as one array.
        checked = [(var, grad.join() if isinstance(grad, GradientPieces) else grad)
                   for var, grad in checked]
        if step is None or isinstance(step, bool) or not isinstance(step, (int, np.integer)) \
                or step < 0:
            raise ValueError(f"synchronous push (num_contributors={num_contributors}, "
                             f"contributor={contributor}) needs a step >= 0, got {step!r}")
        with self._lock:
            index = None if contributor is None else int(contributor)
            for var, _ in checked:  # a deferred older step applies before this one counts
                self._sync.settle(var, int(step))
            self._sync.check(checked, int(step), index)
            self._adopt(checked, optimizer)
            return self._sync.push(checked, int(step), num_contributors, index, wait,
                deadline or Deadline.after(SYNC_WAIT_SECONDS))
