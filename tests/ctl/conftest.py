"""Real-process tests of clusterctl share the per-test marker and leak check of
``tests/processes``."""

from tests.processes.conftest import marker, processes_with

__all__ = ["marker", "processes_with"]
