"""The chief/worker process entry point (``python -m worker``)."""
