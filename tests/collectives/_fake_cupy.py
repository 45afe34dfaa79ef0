"""The fake CuPy of the NCCL tests: :mod:`tests._fakegpu.fakecuda`, under the name these tests
import it by."""

from tests._fakegpu.fakecuda import (
    NCCL_CONSTANTS,
    VERSIONS,
    FakeArray,
    FakeCuda,
    FakeDevice,
    assert_same_bits,
    host,
    is_pinned,
)

__all__ = ["NCCL_CONSTANTS", "VERSIONS", "FakeArray", "FakeCuda", "FakeDevice",
           "assert_same_bits", "host", "is_pinned"]
