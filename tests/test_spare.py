"""Spare files: a write into a recycled file gives the same .npy as a fresh one, takes only a fitting spare,
and the pool keeps to its byte limit, the oldest leaving first."""
import os

import numpy as np
import pytest

from ops.scoring import spare

MB = 1 << 20


def _files(folder):
    return sorted(os.listdir(folder))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "bool", "float64"])
def test_a_write_into_a_spare_reads_back_exactly(tmp_path, dtype):
    pool = str(tmp_path / "spare")
    rng = np.random.default_rng(0)
    old = rng.random(3 * MB // 4).astype(np.float32)  # 3 MB of other values, a longer file than the new one
    np.save(tmp_path / "old.npy", old)
    spare.keep([str(tmp_path / "old.npy")], pool, 64 * MB)
    assert len(_files(pool)) == 1 and not os.path.exists(tmp_path / "old.npy")
    new = (rng.random((512, 2049)) * 100 - 50).astype(dtype)  # 1-8 MB: a spare of 3 MB fits those of 1.5 MB or more
    target = str(tmp_path / "new.npy")
    spare.save(target, new, pool)
    back = np.load(target)
    assert back.dtype == new.dtype and back.shape == new.shape and np.array_equal(back, new)
    taken = new.nbytes <= old.nbytes <= spare.FIT * new.nbytes
    assert len(_files(pool)) == (0 if taken else 1)
    np.save(tmp_path / "fresh.npy", new)  # the same bytes as a fresh file, none of the spare's beyond them
    assert open(target, "rb").read() == open(tmp_path / "fresh.npy", "rb").read()


def test_only_a_fitting_spare_is_taken_and_the_smallest_of_them(tmp_path):
    pool = str(tmp_path / "spare")
    for n in (2, 5, 9, 40):  # MB
        np.save(tmp_path / f"s{n}.npy", np.ones(n * MB, np.uint8))
    spare.keep([str(tmp_path / f"s{n}.npy") for n in (2, 5, 9, 40)], pool, 1 << 30)

    def sizes():
        return sorted(os.path.getsize(os.path.join(pool, f)) // MB for f in _files(pool))
    spare.save(str(tmp_path / "a.npy"), np.zeros(4 * MB + 7, np.uint8), pool)  # fits 5 and 9 (<= 2x): takes 5
    assert sizes() == [2, 9, 40]
    spare.save(str(tmp_path / "b.npy"), np.zeros(10 * MB, np.uint8), pool)  # 40 is more than 2x: a new file
    assert sizes() == [2, 9, 40]
    assert os.path.getsize(tmp_path / "a.npy") == 4 * MB + 7 + 128  # cut to its own length (a 128-byte header)
    assert np.count_nonzero(np.load(tmp_path / "a.npy")) == 0


def test_the_pool_keeps_to_its_limit_oldest_out_first(tmp_path):
    pool = str(tmp_path / "spare")

    def put(name, n):
        np.save(tmp_path / name, np.ones(n * MB, np.uint8))
        spare.keep([str(tmp_path / name)], pool, 20 * MB)
    put("a.npy", 8)
    put("b.npy", 8)
    put("c.npy", 8)  # 24 MB > 20: the oldest (a) goes
    held = sorted(os.path.getsize(os.path.join(pool, f)) for f in _files(pool))
    assert len(held) == 2 and sum(held) <= 20 * MB
    put("huge.npy", 30)  # larger than the whole limit: deleted, nothing evicted for it
    assert len(_files(pool)) == 2 and not os.path.exists(tmp_path / "huge.npy")
    np.save(tmp_path / "small.npy", np.ones(1000, np.uint8))  # under 1 MB: not worth keeping
    spare.keep([str(tmp_path / "small.npy")], pool, 20 * MB)
    assert len(_files(pool)) == 2 and not os.path.exists(tmp_path / "small.npy")
