"""The ``fake_gpu`` fixture for the tests of the fake GPU machine itself."""

from tests._fakegpu import fake_gpu  # noqa: F401  (a fixture)
