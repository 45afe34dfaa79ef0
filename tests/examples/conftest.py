"""Real-process tests of the examples share the per-test marker and leak check of
``tests/processes``."""

from tests.processes.conftest import marker

__all__ = ["marker"]
