"""Test task: draws a progress bar with carriage returns (as tqdm does), then waits until the
test writes to the FIFO (at most 60 s) before finishing the line and exiting. A launcher that
forwards partial lines shows the redraws while this task still runs.

Usage: progress.py FIFO
"""

import os
import select
import sys

# Open before drawing: once the test sees the bar, a reader holds the FIFO, and its
# non-blocking open for writing cannot fail (ENXIO) on loaded cores.
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
for i in (1, 2):
    sys.stdout.write(f"\rstep {i}/3 |{'#' * i}{' ' * (3 - i)}|")
    sys.stdout.flush()
ready, _, _ = select.select([fd], [], [], 60.0)
sys.stdout.write("\rstep 3/3 |###|\n")
print("released" if ready else "never released", flush=True)
