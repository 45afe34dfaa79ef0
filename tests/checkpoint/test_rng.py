"""numpy.random.Generator and random.Random as trackables: draws after a restore equal an
uninterrupted run's, for every bit generator NumPy ships; another bit generator's state is
refused before anything changes."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import safetensors.numpy

import cluster
from cluster.checkpoint import Checkpoint, _format

pytestmark = pytest.mark.timeout(60)

BIT_GENERATORS = [np.random.PCG64, np.random.MT19937, np.random.PCG64DXSM, np.random.Philox,
                  np.random.SFC64]


def _draws(rng: np.random.Generator) -> list:
    # Every kind of draw a training loop makes, including a 32-bit one (which leaves half a
    # 64-bit word buffered in the state: has_uint32/uinteger must survive the round trip).
    return [rng.random(3).tolist(), rng.integers(0, 2**31, 4, dtype=np.int32).tolist(),
            rng.standard_normal(2).tolist(), rng.permutation(6).tolist()]


@pytest.mark.parametrize("bit_generator", BIT_GENERATORS, ids=lambda b: b.__name__)
def test_draws_after_restore_equal_uninterrupted_draws(tmp_path, bit_generator):
    reference = np.random.Generator(bit_generator(1234))
    _draws(reference)
    expected = [_draws(reference) for _ in range(3)]

    rng = np.random.Generator(bit_generator(1234))
    _draws(rng)  # the same history as the reference up to the save
    path = Checkpoint(rng=rng).write(tmp_path / "c")
    _draws(rng)  # the run goes on, then is "preempted"

    fresh = np.random.Generator(bit_generator(99))  # a restarted job seeds differently
    Checkpoint(rng=fresh).read(path)
    assert [_draws(fresh) for _ in range(3)] == expected
    Checkpoint(rng=rng).read(path)  # in place, into the generator that saved it
    assert [_draws(rng) for _ in range(3)] == expected


def test_state_is_a_uint64_tensor_and_the_index_names_the_bit_generator(tmp_path):
    rng = np.random.default_rng(5)
    path = Checkpoint(model={"rng": rng}).write(tmp_path / "c")
    tensors = safetensors.numpy.load_file(os.path.join(path, _format.TENSOR_FILE))
    state = tensors["model/rng/bit_generator_state"]
    assert state.dtype == np.uint64 and state.ndim == 1
    assert state[:4].tobytes().rstrip(b"\0") == b"PCG64"
    with open(os.path.join(path, _format.INDEX_FILE)) as f:
        index = json.load(f)
    assert index["objects"]["model/rng"] == {"kind": "rng", "type": "numpy.random.Generator",
                                             "bit_generator": "PCG64"}


@pytest.mark.parametrize("other", [np.random.MT19937, np.random.PCG64DXSM],
                         ids=["other-layout", "same-layout"])
def test_another_bit_generator_is_refused_and_nothing_changes(tmp_path, other):
    w = cluster.Variable(np.ones(3, np.float32))
    path = Checkpoint(w=w, rng=np.random.Generator(np.random.PCG64(1))).write(tmp_path / "c")
    w.assign(np.zeros(3))
    target = np.random.Generator(other(2))
    before = target.bit_generator.state
    with pytest.raises(ValueError, match=r"rng/bit_generator_state holds a 'PCG64' bit generator "
                                         rf"state but the tracked generator at rng uses "
                                         rf"'{other.__name__}'"):
        Checkpoint(w=w, rng=target).read(path)
    np.testing.assert_array_equal(w.numpy(), np.zeros(3))  # all or nothing
    assert _draws(target) == _draws(np.random.Generator(other(2)))
    assert target.bit_generator.state.keys() == before.keys()


def test_a_state_word_too_large_for_its_field_is_refused(tmp_path):
    # MT19937's key is uint32: a saved word above 2**32 cannot be restored and must not be
    # silently truncated. Craft it by editing a valid state (the sha256 is updated to match).
    rng = np.random.Generator(np.random.MT19937(3))
    path = Checkpoint(rng=rng).write(tmp_path / "c")
    tensors = safetensors.numpy.load_file(os.path.join(path, _format.TENSOR_FILE))
    state = tensors["rng/bit_generator_state"].copy()
    state[4] = 1 << 40  # the first key word (after the 4 name words)
    os.rename(path, str(path) + ".old")
    _format.write_checkpoint(path, {"rng/bit_generator_state": state,
                                    "save_counter": tensors["save_counter"]})
    with pytest.raises(ValueError, match="too large for uint32"):
        Checkpoint(rng=rng).read(path)


def test_generators_in_nests_and_tracked_twice():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="tracked twice"):
        Checkpoint(a=rng, b=[rng])
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        Checkpoint(a=np.random.RandomState(0))


def _py_draws(r: random.Random) -> list:
    # gauss() makes two values at a time and caches the second: a save between them must keep it.
    return [r.random(), r.getrandbits(70), r.gauss(0.0, 1.0), r.randrange(10**6)]


def test_python_random_round_trips_with_its_cached_gauss(tmp_path):
    reference = random.Random(7)
    _py_draws(reference)
    expected = [_py_draws(reference) for _ in range(3)]
    r = random.Random(7)
    _py_draws(r)
    assert r.getstate()[2] is not None  # a Gaussian is cached: the case that must survive
    path = Checkpoint(r=r).write(tmp_path / "c")
    fresh = random.Random(0)
    Checkpoint(r=fresh).read(path)
    assert [_py_draws(fresh) for _ in range(3)] == expected
    with pytest.raises(TypeError, match="SystemRandom"):
        Checkpoint(r=random.SystemRandom())
    with pytest.raises(ValueError, match="not tracked here"):  # a Generator is not a Random
        Checkpoint(r=np.random.default_rng(0)).read(path)
