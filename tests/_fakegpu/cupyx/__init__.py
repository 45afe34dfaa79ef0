"""``import cupyx`` on the fake GPU machine: the fake's pinned-memory helpers (``empty_pinned``,
``zeros_pinned``). See ``tests/_fakegpu/cupy/__init__.py``."""

import sys

import cupy  # noqa: F401  (builds the machine: cupyx belongs to it)
from fakecuda import machine_from_env

sys.modules.update(machine_from_env().modules())
