"""Cheat for the grader's tests: ops, but max_pool3d returns float32 for float16/bfloat16 inputs and permute
returns int64 for int8 inputs (the right values in a wider dtype)."""
import ops
from ops import *  # noqa: F401,F403


def max_pool3d(x, *args, **kwargs):
    out = ops.max_pool3d(x, *args, **kwargs)
    if str(x.dtype) in ("float16", "bfloat16"):
        return out.float32()
    return out


def permute(x, *dims):
    out = ops.permute(x, *dims)
    return out.int64() if str(x.dtype) == "int8" else out
