"""Cheat for the grader's tests: ops, but the gradient of broadcast_to/expand_as is off in one element (its first):
by 1e-2 in float32 and float64, and in a 16-bit dtype by 1e-2 or 3 units in the last place of that element,
whichever is more (from 8 up a float16's unit in the last place is 0.0078 or more, so 1e-2 is at most 1.3 of
them, within what a judge of rounded sums must allow: 1e-2 alone let this cheat pass 21 times in 300 on a
float16 case). The rest is the float64 sum of the output gradient over the broadcast axes, rounded once, so that
the bumped element is the only one off (a float32 sum of 167k terms was off by 0.0045 where 0.0039 is allowed)."""
import numpy as np

import ops
from ops import *  # noqa: F401,F403
from ops._jittor import jt
from ops.scoring.judge import ulp


class _BroadcastOffByOne(jt.Function):
    def execute(self, x, shape):
        self.x_shape, self.dtype = tuple(x.shape), str(x.dtype)
        return ops.broadcast_to(x, shape)

    def grad(self, g):
        lead = len(g.shape) - len(self.x_shape)
        padded = (1,) * lead + self.x_shape
        axes = [d for d, (a, b) in enumerate(zip(padded, g.shape)) if d < lead or (a == 1 and b != 1)]
        total = g.float64().sum(dims=axes, keepdims=True) if axes else g.float64()
        first = float(total.reshape(-1)[0].item())
        bump = np.zeros(self.x_shape, dtype=np.float64)
        units = 3 * float(ulp(np.array([first]), self.dtype)[0]) if self.dtype in ("float16", "bfloat16") else 0.0
        bump.reshape(-1)[0] = max(1e-2, units)
        return (total.reshape(self.x_shape) + jt.array(bump)).astype(self.dtype), None


def broadcast_to(x, shape):
    return _BroadcastOffByOne.apply(x, tuple(shape))


def expand_as(x, other):
    return broadcast_to(x, other.shape)
