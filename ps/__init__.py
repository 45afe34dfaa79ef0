"""The parameter-server process entry point (``python -m ps``)."""
