"""Reading the one JSON line a bench task prints when it is done.

Every bench that starts task processes (``python -m worker`` ranks, torch ranks) has each print
``PREFIX{json}`` as its result and reads it back here, so a task that failed, hung or printed
nothing ends the bench with its exit code and the tail of its output.
"""

from __future__ import annotations

import json
from typing import Any

from cluster.testing import TaskProcessError

__all__ = ["task_result"]


def task_result(task: Any, timeout: float, prefix: str, what: str,
                error: type[Exception] = RuntimeError) -> Any:
    """The JSON after ``prefix`` on the last such line ``task`` printed, once it exits 0.

    Raises ``error`` starting with ``what`` when the task fails to finish within ``timeout``
    seconds, exits non-zero, or printed no result line.
    """
    try:
        code, output = task.finish(timeout)
    except TaskProcessError as e:
        raise error(f"{what}: {e}") from e
    found = [line for line in output.splitlines() if line.startswith(prefix)]
    if code != 0 or not found:
        raise error(f"{what}: {task.name} exited {code} without a result:\n{output[-3000:]}")
    return json.loads(found[-1][len(prefix):])
