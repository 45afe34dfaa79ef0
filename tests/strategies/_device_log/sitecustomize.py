"""Put this folder on ``PYTHONPATH`` to make every Python process show the strategies' device
choice (an INFO line of ``cluster.strategies._devices``; tasks log warnings only): tests read
which device each task of a launched run took."""

import logging

logging.getLogger("cluster.strategies._devices").setLevel(logging.INFO)
