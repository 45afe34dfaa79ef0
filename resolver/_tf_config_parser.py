"""The ``TF_CONFIG`` document parser: parse and shape-check the JSON text of the variable.

``parse_tf_config(text)`` is a pure function of the variable's text (``None`` when it is unset)
returning a ``TFConfig`` whose accessors check one field each, when it is read, as TensorFlow
reads one key at a time. ``ClusterConfigError`` (naming ``TF_CONFIG`` and the path of the bad
field) is raised wherever TensorFlow would crash with a raw ``JSONDecodeError``, ``TypeError`` or
``ValueError``, and wherever TF would silently turn a wrongly typed field into nonsense: a
top-level array or string meaning "no cluster", ``"task": "worker"`` meaning "no task",
``"type": null`` meaning a job called ``"None"`` (a numeric ``"type": 123456`` is read as
the job ``"123456"``, as in TF), ``"index": 1.7`` or ``true`` meaning task 1,
``"rpc_layer": 5`` giving ``"5://..."``.

It is otherwise as lenient as TensorFlow: addresses are any strings (no ``host:port`` check),
``task.index`` may be a string that ``int()`` accepts (``"1"``), sparse job keys are whatever
``int()`` accepts, unknown keys are ignored, and whether the task is in the cluster is not
checked here (``master()`` fails for that, as in TF).
"""

from __future__ import annotations

import json
from typing import Any

from resolver.errors import ClusterConfigError

__all__ = ["TFConfig", "parse_tf_config"]

_SOURCE = "TF_CONFIG"
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1

Job = list[str] | dict[int, str]


def _show(value: Any) -> str:
    """A value as it would look in TF_CONFIG, cut short so a bad 10,000-entry job stays readable."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(value: Any) -> str:
    """``null``, ``a number 5``, ``a string "x"``, ``an array [...]``: type and value in one."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        kind = "a boolean"
    elif isinstance(value, (int, float)):
        kind = "a number"
    else:
        kind = {dict: "an object", list: "an array", str: "a string"}.get(type(value), "a value")
    return f"{kind} {_show(value)}"


def _fail(path: str, message: str) -> ClusterConfigError:
    return ClusterConfigError(f"{_SOURCE}: {path}: {message}" if path else f"{_SOURCE}: {message}")


def _member(parent: str, key: str) -> str:
    # cluster.worker for identifier-like names, cluster["my-job"] otherwise, so the path is
    # unambiguous and can be pasted into a JSON query.
    if key.isidentifier():
        return f"{parent}.{key}"
    return f"{parent}[{json.dumps(key)}]"


def _address(path: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(path, f'expected a "host:port" string, got {_show(value)}')
    return value


def _sparse_index(path: str, key: str) -> int:
    try:
        index = int(key)  # TF converts keys with int(): " 1" and "+1" are task 1.
    except ValueError:
        raise _fail(path, f"task index keys must be integers, got {_show(key)}") from None
    if not _INT32_MIN <= index <= _INT32_MAX:
        raise _fail(path, f"task index {index} is out of the int32 range")
    return index


def _job(path: str, tasks: Any) -> Job:
    if isinstance(tasks, list):
        return [_address(f"{path}[{i}]", address) for i, address in enumerate(tasks)]
    if isinstance(tasks, dict):
        job: dict[int, str] = {}
        for key, address in tasks.items():
            item = f"{path}[{json.dumps(key)}]"
            job[_sparse_index(item, key)] = _address(item, address)
        return job
    raise _fail(
        path,
        'expected an array of "host:port" strings or an {"index": "host:port"} object, '
        f"got {_describe(tasks)}",
    )


def _cluster(value: Any) -> dict[str, Job]:
    if not isinstance(value, dict):
        raise _fail(
            "cluster", f"expected an object mapping job names to tasks, got {_describe(value)}"
        )
    return {name: _job(_member("cluster", name), tasks) for name, tasks in value.items()}


def _task_id(value: Any) -> int:
    # TF applies int() to task.index; accept what int() turns into an integer without loss of
    # meaning (integers and strings such as "1"), reject floats, booleans and everything else.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise _fail("task.index", f"expected an integer, got {_describe(value)}")


def _task_type(value: Any) -> str:
    # TF reads str(task["type"]), so a job named "123456" may be given as the number 123456 (TF's
    # testTaskTypeCastToString). Null and booleans would become jobs called "None" and "True":
    # refused, as are arrays and objects, which no job name can spell.
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise _fail("task.type", f"expected a string (or a number), got {_describe(value)}")


def _optional_str(path: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _fail(path, f"expected a string, got {_describe(value)}")


class TFConfig:
    """A parsed ``TF_CONFIG`` whose fields are shape-checked when read, not all at once.

    TensorFlow only looks at the keys a call needs (``task_type`` never reads ``cluster``), so a
    bad field fails exactly the calls that use it, and nothing else. Each accessor returns
    ``None`` for an absent (or, except ``cluster``, null) key.
    """

    __slots__ = ("_doc",)

    def __init__(self, doc: dict[str, Any]) -> None:
        self._doc = doc

    def cluster(self) -> dict[str, Job] | None:
        """``{job: tasks}`` checked and with sparse keys as ints; ``None`` when absent."""
        if "cluster" not in self._doc:
            return None
        return _cluster(self._doc["cluster"])

    def _task(self) -> dict[str, Any]:
        task = self._doc.get("task", {})
        if not isinstance(task, dict):
            raise _fail(
                "task",
                f'expected an object like {{"type": "worker", "index": 0}}, got {_describe(task)}',
            )
        return task

    def task_type(self) -> str | None:
        task = self._task()
        if "type" not in task:
            return None
        return _task_type(task["type"])

    def task_id(self) -> int | None:
        task = self._task()
        return _task_id(task["index"]) if "index" in task else None

    def rpc_layer(self) -> str | None:
        return _optional_str("rpc_layer", self._doc.get("rpc_layer"))

    def session_master(self) -> str | None:
        return _optional_str("session_master", self._doc.get("session_master"))


def parse_tf_config(text: str | None) -> TFConfig:
    """Parse ``TF_CONFIG``'s text; ``None`` (unset) gives an empty config, as in TF.

    Raises:
        ClusterConfigError: the text is empty, not JSON, or not a JSON object. Fields are
            checked later, by the ``TFConfig`` accessor that reads them.
    """
    if text is None:
        return TFConfig({})
    if not text.strip():
        raise _fail("", "is set but empty; expected a JSON object (unset it for no cluster)")
    try:
        doc = json.loads(text)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise _fail("", f"invalid JSON: {e}") from e
    except RecursionError as e:  # absurdly deep nesting
        raise _fail("", "invalid JSON: nested too deeply (TF_CONFIG needs 3 levels: "
                    '{"cluster": {"worker": ["host:port"]}}); check how it is generated') from e
    if not isinstance(doc, dict):
        raise _fail("", f"expected a JSON object at the top level, got {_describe(doc)}")
    return TFConfig(doc)
