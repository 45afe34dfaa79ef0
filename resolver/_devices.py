"""How many GPUs this process can use, found with the standard library only.

TensorFlow asks its runtime for the local devices; this package has no runtime, so it reads what
the CUDA driver would honour:

1. ``CUDA_VISIBLE_DEVICES`` when it is set (even to ``""``). The list is read the way CUDA reads
   it: entries up to the first invalid one (a negative number such as ``-1``) count, so ``""``
   and ``"-1"`` mean no GPU and ``"0,-1,1"`` means one.
2. Otherwise the GPU device nodes ``/dev/nvidia0``, ``/dev/nvidia1``, ... (``nvidiactl`` and
   ``nvidia-uvm`` are not GPUs). In a container these are the GPUs mapped into it.
3. Otherwise the per-GPU entries of ``/proc/driver/nvidia/gpus``.

Nothing here raises: an unreadable directory counts as no GPU.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Mapping

__all__ = ["local_accelerators", "local_gpu_count"]

_GPU_NODE = re.compile(r"nvidia[0-9]+")


def _count_visible(value: str) -> int:
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        # CUDA stops at the first invalid entry; "-1" is the conventional "hide everything".
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def _count_entries(directory: str, pattern: re.Pattern[str] | None = None) -> int:
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    if pattern is None:
        return len(names)
    return sum(1 for name in names if pattern.fullmatch(name))


def local_gpu_count(
    environ: Mapping[str, str] | None = None,
    dev_dir: str = "/dev",
    proc_gpus_dir: str = "/proc/driver/nvidia/gpus",
) -> int:
    """Number of GPUs visible to this process (0 when there are none or they are hidden).

    ``environ`` defaults to ``os.environ`` (read at call time); the directories are parameters
    so tests can point them at a temporary tree.
    """
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return _count_visible(visible)
    nodes = _count_entries(dev_dir, _GPU_NODE)
    if nodes:
        return nodes
    return _count_entries(proc_gpus_dir)


def local_accelerators(
    environ: Mapping[str, str] | None = None,
    dev_dir: str = "/dev",
    proc_gpus_dir: str = "/proc/driver/nvidia/gpus",
) -> defaultdict[str, int]:
    """``{"GPU": n}`` when this process sees ``n > 0`` GPUs, else ``{}``.

    Like TensorFlow's ``ClusterResolver.num_accelerators`` the result is a
    ``collections.defaultdict(int)``, so ``result["GPU"]`` is ``0`` rather than a ``KeyError``
    on a machine without GPUs.
    """
    result: defaultdict[str, int] = defaultdict(int)
    count = local_gpu_count(environ, dev_dir, proc_gpus_dir)
    if count > 0:
        result["GPU"] = count
    return result
