"""A toy op family for testing the grader end to end (right, wrong, crashing and hanging cases) and the registry:
``RECORD`` below is all it takes for ``OPS_SCORING_FAMILY_MODULES=toy_family`` to put it in the grader's table,
the compile-budget test and the bench (tests/test_family_registry.py)."""
import os
import time

import numpy as np

from ops._jittor import jt
from ops.registry import FamilyRecord
from ops.scoring.spec import Family, ReferenceSkipped, case

CPU_SRC = ('float s = data["scale"];'
           "for (int i = 0; i < in0_shape0; i++) @out0(i) = (out0_type)((float)@in0(i) * s);")


class ScaleFunction(jt.Function):
    def execute(self, x, scale):
        self.scale = scale
        return jt.code(x.shape, x.dtype, [x], cpu_src=CPU_SRC, data={"scale": scale})

    def grad(self, g):
        return jt.code(g.shape, g.dtype, [g], cpu_src=CPU_SRC, data={"scale": self.scale})


def scale(x):
    """The toy's public function: x times 2."""
    return ScaleFunction.apply(x, 2.0)


def bench_calls(kit):
    """The toy's rows of ``python -m ops.bench calls``: (name, ours, jittor's, PyTorch's or None)."""
    x = kit.var((4096,))
    return [("toy scale (4096,)", lambda: scale(x), lambda: x * 2, None)]


class ToyFamily(Family):
    def forward(self, c, api, xs):
        behaviour = c.p["behaviour"]
        if behaviour == "crash":
            os._exit(3)
        if behaviour == "hang":
            time.sleep(3600)
        if behaviour == "raise":
            raise RuntimeError("kernel exploded")
        return [ScaleFunction.apply(xs[0], 3.0 if behaviour == "wrong" else 2.0)]

    def reference_forward(self, c, arrays):
        return [2.0 * arrays[0].astype(np.float64)]

    def reference_backward(self, c, arrays, grads_out):
        return [2.0 * grads_out[0].astype(np.float64)]

    def naive_forward(self, c, xs):
        if c.p["behaviour"] == "refhang":
            time.sleep(3600)
        return [xs[0] * 2]

    def jittor_forward(self, c, xs):
        if c.direction == "bwd":
            raise ReferenceSkipped("too slow for toys")
        raise RuntimeError("no built-in for toys")

    def bytes_moved(self, c):
        return 2 * 4 * c.shapes[0][0]

    def variant(self, c, api):
        return "scale"


def _case(name, direction="fwd", **params):
    return case("toy", name, direction, [(4096,)], "float32", devices=("cpu",), **params)


FAMILY = ToyFamily("toy", [_case("ok", behaviour="ok"), _case("ok", "bwd", behaviour="ok"),
                           _case("wrong", behaviour="wrong"), _case("raise", behaviour="raise"),
                           _case("crash", behaviour="crash"), _case("hang", behaviour="hang"),
                           _case("refhang", behaviour="refhang"), _case("after", behaviour="ok")])

RECORD = FamilyRecord("toy", "toy_family", functions=("scale",), grader="toy_family", bench="toy_family:bench_calls")
