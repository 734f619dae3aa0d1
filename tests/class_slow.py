"""A class-grading test submission: ops, but every call sleeps 1 ms first (correct, slow)."""
import time

import ops
from ops import *  # noqa: F401,F403


def _slow(fn):
    def call(*args, **kwargs):
        time.sleep(1e-3)
        return fn(*args, **kwargs)
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


max_pool3d, permute, transpose, transpose_add = (_slow(f) for f in (ops.max_pool3d, ops.permute, ops.transpose,
                                                                     ops.transpose_add))
expand_as, broadcast_to, timex = (_slow(f) for f in (ops.expand_as, ops.broadcast_to, ops.timex))
