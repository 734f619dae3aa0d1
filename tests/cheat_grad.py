"""Cheat for the grader's tests: ops, but the gradient of broadcast_to/expand_as is off by 1e-2 in one
element (its first); the rest is the float32 sum of the output gradient over the broadcast axes."""
import numpy as np

import ops
from ops import *  # noqa: F401,F403
from ops._jittor import jt


class _BroadcastOffByOne(jt.Function):
    def execute(self, x, shape):
        self.x_shape, self.dtype = tuple(x.shape), str(x.dtype)
        return ops.broadcast_to(x, shape)

    def grad(self, g):
        lead = len(g.shape) - len(self.x_shape)
        padded = (1,) * lead + self.x_shape
        axes = [d for d, (a, b) in enumerate(zip(padded, g.shape)) if d < lead or (a == 1 and b != 1)]
        total = g.float32().sum(dims=axes, keepdims=True) if axes else g.float32()
        bump = np.zeros(self.x_shape, dtype=np.float32)
        bump.reshape(-1)[0] = 1e-2
        return (total.reshape(self.x_shape) + jt.array(bump)).astype(self.dtype), None


def broadcast_to(x, shape):
    return _BroadcastOffByOne.apply(x, tuple(shape))


def expand_as(x, other):
    return broadcast_to(x, other.shape)
