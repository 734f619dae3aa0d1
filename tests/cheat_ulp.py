"""Cheat for the grader's tests: ops, but max_pool3d's values are off by 5e-7 (float32) or one unit in the
last place (float16, bfloat16): within any float tolerance, wrong for an op that selects values."""
import ops
from ops import *  # noqa: F401,F403


def max_pool3d(x, *args, **kwargs):
    out = ops.max_pool3d(x, *args, **kwargs)
    values = out[0] if isinstance(out, tuple) else out
    dtype = str(values.dtype)
    if dtype == "float32":
        values = values + 5e-7
    else:
        step = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
        values = (values.float32() * (1 + step)).astype(dtype)  # a unit up (or more) for all but tiny values
    return (values,) + tuple(out[1:]) if isinstance(out, tuple) else values
