"""Compile the CUDA kernels the tests use, in parallel, before ``pytest -m cuda``: ``python tests/warm_cuda.py``.

jittor compiles the new kernels of one ``jt.sync`` in parallel (one nvcc per translation unit); a test run
meets them one at a time, and several pytest workers sharing jittor's cache serialize on its lock. This builds a
tiny call of every op for every dtype and direction (each of them one translation unit of a menu, the same for
every shape) and syncs them once, so the tests then find their kernels in the cache.

It also replays the calls of ``tests/cuda_calls.jsonl`` (``tests/call_record.py``): every call the CPU half of the
op tests makes, with the same shapes, dtypes and switches as the CUDA half, and of ``tests/cuda_test_calls.jsonl``:
the first op call of every CUDA test (the CUDA-only ones have no CPU half), recorded beforehand on any machine,
so that the CUDA tests meet few kernels to compile (jittor compiles one per dtype and rank of each code op:
broadcast's alone are a hundred).
"""
import argparse
import sys
import time

import numpy as np

import call_record
import ops
from ops._jittor import jt


def _var(shape, dtype, rng):
    return jt.array(rng.uniform(-1, 1, shape).astype(np.float32)).astype(dtype)


def calls(rng):
    """Lazily built outputs of one small call per translation unit (forward and backward)."""
    out = []

    def both(f, *xs):
        with jt.no_grad():
            out.append(f(*xs))
        y = f(*xs)
        out.extend(jt.grad((y * y).sum(), list(xs)))

    for dtype in ("float32", "float16", "bfloat16", "float64"):
        x = _var((2, 3, 8, 8, 8), dtype, rng)
        both(lambda v: ops.max_pool3d(v, 2), x)
        out.append(ops.max_pool3d(x, 3, 1, return_indices=True)[1])
        both(lambda v: ops.broadcast_to(v, (4, 3, 64)), _var((3, 1), dtype, rng))
        both(lambda v: ops.broadcast_to(v, (2, 3, 40, 5)), _var((2, 1, 1, 5), dtype, rng))
    for dtype in ("float32", "float16", "bfloat16", "int8", "bool", "int64", "uint8", "int32", "float64"):
        x = jt.array(rng.integers(0, 2, (4, 48, 40))).astype(dtype)
        out.append(ops.permute(x, 0, 2, 1))
        out.append(ops.transpose_add(x, ops.permute(x, 0, 2, 1), 1, 2))
    for dtype in ("float32", "float16", "bfloat16"):
        w, k = _var((3, 40), dtype, rng), _var((2, 3, 40), dtype, rng)
        both(ops.timex, w, k)
        w, k = _var((3, 96), dtype, rng), _var((16, 3, 96), dtype, rng)  # the tensor-core kernels' batch
        with jt.no_grad():
            out.append(ops.timex(w, k))
    return out


# Outputs synced at once (jittor compiles each sync's new kernels in parallel): few enough elements to fit
# any GPU.
SYNC_ELEMENTS = 1 << 28


def sync_in_batches(outs) -> None:
    batch, held = [], 0
    for v in outs:
        batch.append(v)
        held += int(np.prod(v.shape))
        if held > SYNC_ELEMENTS:
            jt.sync(batch)
            batch, held = [], 0
    jt.sync(batch)


# The CUDA tests' first calls are replayed up to this many input elements (their GPU-sized cases included; synced
# in batches).
GPU_TEST_ELEMENTS = 1 << 28


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    if not ops.has_cuda():
        print("warm_cuda: jittor has no CUDA here; nothing to compile")
        return 0
    jt.flags.use_cuda = 1
    start = time.monotonic()
    rng = np.random.default_rng(0)
    entries = call_record.load(call_record.RECORDING) + call_record.load(call_record.CUDA_TESTS_RECORDING,
                                                                         GPU_TEST_ELEMENTS)
    outs = calls(rng) + call_record.replay(entries, rng)
    sync_in_batches(outs)
    print(f"warm_cuda: {len(outs)} outputs ({len(entries)} recorded calls) built in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
