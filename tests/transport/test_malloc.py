"""``_malloc.tune_for_large_buffers``: where threads' large buffers come from.

mallopt is process-wide, so each case runs in a fresh interpreter.
"""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
import textwrap

import pytest

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux") or not ctypes.util.find_library("c"),
                       reason="glibc's mallopt: Linux only"),
]

# A thread mallocs 1 MiB: is it in the main heap (below the program break) or in an arena of
# its own (mmap'd, far above it)? glibc gives a new thread its own arena unless M_ARENA_MAX says
# otherwise.
_PROBE = textwrap.dedent("""
    import ctypes, sys, threading
    from cluster.transport import _malloc
    ok = _malloc.tune_for_large_buffers(one_arena={one_arena})
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.sbrk.restype = ctypes.c_void_p
    libc.sbrk.argtypes = (ctypes.c_long,)
    where = []
    def probe():
        p = libc.malloc(1 << 20)
        where.append(p < libc.sbrk(0))
        libc.free(ctypes.c_void_p(p))
    t = threading.Thread(target=probe)
    t.start(); t.join()
    print(ok, where[0])
""")


def _run(one_arena: bool) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", _PROBE.format(one_arena=one_arena)],
                          capture_output=True, text=True, timeout=50, check=True)
    ok, in_main_heap = done.stdout.split()
    return ok, in_main_heap


def test_one_arena_puts_threads_buffers_in_the_main_heap() -> None:
    # python -m ps: its RPC threads' replies reuse warm heap pages instead of fresh ones.
    assert _run(one_arena=True) == ("True", "True")


def test_workers_keep_per_thread_arenas() -> None:
    # The default (workers): user threads do not contend for one heap.
    assert _run(one_arena=False) == ("True", "False")
