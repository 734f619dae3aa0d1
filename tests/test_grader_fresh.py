"""The grader's per-call inputs (``ops.scoring.fresh``): the device's copies are the NumPy mirror's bit for bit
(the parent judges a checked call on the mirror's), they differ from call to call and keep each value's kind and
range; the samples of outputs are the outputs' bytes."""
import numpy as np
import pytest

from ops._jittor import jt
from ops.scoring import fresh
from ops.scoring.harness import hand_back_array, to_jittor
from ops.scoring.judge import host_values
from ops.scoring.spec import edge_array, random_array

DTYPES = ["float32", "float16", "bfloat16", "float64", "int8", "int64", "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 1, 1), (3, 45), (2, 3, 41)])  # a small array (low bits flipped too) and two
def test_device_copies_are_the_numpy_mirrors_bit_for_bit(device, dtype, shape, rng):
    make = edge_array if dtype.startswith(("float", "bfloat")) and shape != (3, 45) else random_array
    a = make(shape, dtype, rng)
    keys = tuple(int(k) for k in rng.integers(0, 1 << 32, size=2))
    x = to_jittor(a, dtype)
    for count in (1, fresh.MAX_COPIES):
        first = int(rng.integers(0, 1 << 20))
        copies = fresh.fresh_copies(x, dtype, keys, first, count)
        jt.sync(copies)
        for j, c in enumerate(copies):
            assert tuple(c.shape) == shape and str(c.dtype) == dtype
            got = np.ascontiguousarray(host_values(hand_back_array(c), dtype))
            want = fresh.flip_numpy(a, dtype, keys, first + j)
            assert_same_bits(got, want, dtype, j)


def assert_same_bits(got, want, dtype, j):
    """Bit for bit, but a NaN's payload: a bfloat16 set reaches the device through a float32 -> bfloat16 cast,
    which on a GPU makes every NaN CUDA's canonical 0x7FFF (cuda_bf16.hpp) where the host's float32 holds
    0x7FC00000. A NaN stays a NaN of the mirror's sign: the sets' NaN are positive, and the flips that follow the
    cast give the sign (the judge compares NaN as NaN)."""
    if got.dtype.kind == "f":
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan) and np.array_equal(np.signbit(got), np.signbit(want)), (dtype, j)
        got, want = got[~nan], want[~nan]
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (dtype, j)


def test_calls_differ_and_keep_kinds_ranges_and_ties():
    rng = np.random.default_rng(3)
    a = edge_array((40, 50), "float32", rng)
    copies = [fresh.flip_numpy(a, "float32", (5, 6), call) for call in range(64)]
    assert len({c.tobytes() for c in copies}) == 64
    for c in copies:
        assert np.array_equal(np.abs(c), np.abs(a), equal_nan=True)  # signs only: ties, NaN, Inf, zeros stay
        flipped = np.signbit(c) != np.signbit(a)
        assert 0.4 < flipped.mean() < 0.6
    small = np.array([0.75, -0.3, 0.0, np.inf, np.nan, 1e-40], np.float32)  # 1e-40: subnormal, kept as it is
    seen = {fresh.flip_numpy(small, "float32", (5, 6), call).tobytes() for call in range(256)}
    assert len(seen) == 256  # low significand bits too: a few elements still give every call its own inputs
    for call in range(256):
        c = fresh.flip_numpy(small, "float32", (5, 6), call)
        assert 0.5 <= abs(c[0]) < 1.0 and 0.25 <= abs(c[1]) < 0.5  # the exponent stays
        assert c[2] == 0 and np.isinf(c[3]) and np.isnan(c[4]) and abs(c[5]) == np.float32(1e-40)
    ints = random_array((1000,), "int8", rng)
    flipped = fresh.flip_numpy(ints, "int8", (1, 2), 0)
    assert np.all((flipped == ints) | (flipped == ~ints)) and 0.4 < np.mean(flipped != ints) < 0.6


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool"])
def test_samples_are_the_outputs_bytes_at_the_positions(device, dtype):
    rng = np.random.default_rng(4)
    outs = [to_jittor(random_array((6, 7, 9), dtype, rng), dtype) for _ in range(fresh.MAX_COPIES)]
    positions = fresh.sample_positions((6, 7, 9), rng)
    for count in (1, fresh.MAX_COPIES):
        got = fresh.sample_op(outs[:count], jt.array(positions)).numpy()
        for j in range(count):
            want = np.ascontiguousarray(hand_back_array(outs[j])).reshape(-1)[positions]
            assert got[j].tobytes() == want.tobytes()


def test_copies_and_samples_take_one_or_max_copies():
    x = jt.zeros((4,), "float32")
    with pytest.raises(ValueError, match="count"):
        fresh.fresh_copies(x, "float32", (1, 2), 0, 3)
    with pytest.raises(ValueError, match="outs"):
        fresh.sample_op([x, x], jt.zeros((fresh.SAMPLES,), "int32"))


@pytest.mark.nvcc
def test_the_cuda_kernels_compile():
    from nvcc_util import compile_check

    from ops import _codegen
    header = _codegen.snippet("grader_hash.h") + _codegen.snippet("grader_fresh")
    body = "\n".join(
        [f"{{ void* outs[8] = {{0}}; ops_grader::fresh_copies<{t}>((const void*)0, 100, outs, 8, 1u, 2u, 3u, ({t})1, "
         f"({t})3, ({t})12, 1); }}" for t in ("uint8_t", "uint16_t", "uint32_t", "uint64_t")]
        + ["{ const void* ins[8] = {0}; ops_grader::sample_bytes(ins, 8, 4, (const int32_t*)0, 64, (uint8_t*)0); }"])
    ok, log = compile_check(header, body)
    assert ok, log[-3000:]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 1, 1), (3, 45), (4, 33, 70)])
def test_flips_at_positions_are_the_whole_arrays_flips_there(dtype, shape, rng):
    """The judge's references of sampled elements read a call's inputs at a few positions (fresh.flip_at): the
    same values as the whole flipped copy there, small arrays' low bits included."""
    a = (edge_array if dtype.startswith(("float", "bfloat")) else random_array)(shape, dtype, rng)
    keys = tuple(int(k) for k in rng.integers(0, 1 << 32, size=2))
    idx = rng.integers(0, a.size, size=200)
    for call in (0, 1, int(rng.integers(0, 1 << 30))):
        want = fresh.flip_numpy(a, dtype, keys, call).reshape(-1)[idx]
        got = fresh.flip_at(a, dtype, keys, call, idx)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (dtype, call)
