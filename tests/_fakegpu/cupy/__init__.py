"""``import cupy`` on the fake GPU machine: the strict fake CuPy of ``fakecuda``, over host memory.

Found first when ``tests/_fakegpu`` leads ``PYTHONPATH`` (see ``tests/_fakegpu/__init__.py``).
``CLUSTER_FAKE_GPUS`` (default 1) GPUs exist, of which ``CUDA_VISIBLE_DEVICES`` leaves some
visible, as the CUDA driver does; ``CLUSTER_FAKE_CUPY`` (default the newest modelled, 14.x)
is ``cupy.__version__``. The fake's modules replace this package in ``sys.modules``, so
``cupy``, ``cupy.cuda`` and ``cupy.cuda.nccl`` are the fake's own.
"""

import sys

from fakecuda import machine_from_env

sys.modules.update(machine_from_env().modules())
