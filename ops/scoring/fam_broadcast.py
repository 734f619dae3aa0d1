"""Grader cases for expand_as / broadcast_to (issue 5): the Paddle OP-benchmark shapes, a middle-dim expand, a
scalar expand and 256 MB outputs on the GPU; small versions of the same patterns for the CPU path.

A case's ``shapes`` holds x's shape only; the target shape is the parameter ``out``. Forward = the materialized
broadcast; backward (the harness differentiates forward) = dy summed over the broadcast dims.
"""
from __future__ import annotations

import importlib
import math
from typing import List, Sequence, Tuple

import numpy as np

from .. import _codegen
from .judge import Expected, sum_bound
from .spec import DEFAULT_TOLERANCE, EDGE, Case, Family, case, edge_array, is_edge, random_array

NAME = "expand_as"


def _reduce_axes(x_shape, out_shape) -> Tuple[int, ...]:
    """Axes of out_shape that the backward sums: the leading axes x lacks and x's expanded size-1 axes."""
    lead = len(out_shape) - len(x_shape)
    padded = (1,) * lead + tuple(x_shape)
    return tuple(d for d, (a, b) in enumerate(zip(padded, out_shape)) if d < lead or (a == 1 and b != 1))


# dy elements per block of the backward's float64 sums (their temporaries stay in the caches and in the
# allocator's reuse: the 8192x8192 tile's sums took 3.5 s whole on one core, page faults of 0.5 GB temporaries).
SUM_BLOCK_ELEMENTS = 1 << 20


def reference_sums(g: np.ndarray, axes: Tuple[int, ...]) -> Tuple[np.ndarray, np.ndarray]:
    """(float64 sums of ``g`` over ``axes``, the 2-norms of their finite terms), keepdims shapes, computed over
    blocks of ``g``'s first axis (NaN and infinities propagate into the sums as in a whole-array sum)."""
    g = np.asarray(g)
    if g.ndim == 0:
        v = np.float64(g)
        return np.asarray(v), np.asarray(abs(v) if np.isfinite(v) else 0.0)
    shape = tuple(1 if d in axes else n for d, n in enumerate(g.shape))
    total, squares = np.zeros(shape), np.zeros(shape)
    rows = max(1, SUM_BLOCK_ELEMENTS // max(1, math.prod(g.shape[1:])))
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, g.shape[0], rows):
            block = g[start:start + rows].astype(np.float64)
            sums = block.sum(axis=axes, keepdims=True)
            np.copyto(block, 0.0, where=~np.isfinite(block))
            block *= block
            sq = block.sum(axis=axes, keepdims=True)
            if 0 in axes:
                total += sums
                squares += sq
            else:
                total[start:start + rows] = sums
                squares[start:start + rows] = sq
    return total, np.sqrt(squares)


class ExpandAsFamily(Family):
    def make_inputs(self, case: Case, rng: np.random.Generator) -> List[np.ndarray]:
        if is_edge(case):
            return [edge_array(case.shapes[0], case.dtype, rng, self.edge_density(case))]
        return [random_array(case.shapes[0], case.dtype, rng)]

    def output_shapes(self, case: Case):
        return [tuple(case.p["out"])]

    def edge_density(self, case: Case) -> float:
        """Backward: about one special value in every other reduction, so that the gradient holds NaN, +-Inf
        and finite sums side by side."""
        if case.direction == "fwd":
            return 0.02
        return 0.5 / (4 * self._reduction_length(case))

    @staticmethod
    def _reduction_length(case: Case) -> int:
        return math.prod(case.p["out"]) // max(1, math.prod(case.shapes[0]))

    def expected(self, case: Case, arrays, grads_out=None):
        """Forward: a copy, bit for bit with the sign of zero. Backward: per element, a sum of
        ``_reduction_length`` output-gradient values (``sum_bound`` from the sum and its terms' 2-norm)."""
        if case.direction == "fwd":
            return [Expected(np.broadcast_to(arrays[0], case.p["out"]), (case.dtype,), signed_zero=True)]
        want, l2 = reference_sums(grads_out[0], _reduce_axes(case.shapes[0], case.p["out"]))
        want, l2 = want.reshape(case.shapes[0]), l2.reshape(case.shapes[0])
        acc = "float64" if case.dtype == "float64" else "float32"
        return [Expected(want, (case.dtype,), "rounded",
                         sum_bound(want, l2, self._reduction_length(case), case.dtype, acc))]

    def reference_forward(self, case: Case, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        return [np.broadcast_to(np.asarray(arrays[0], dtype=np.float64), case.p["out"]).copy()]

    def reference_backward(self, case: Case, arrays, grads_out) -> List[np.ndarray]:
        x_shape = case.shapes[0]
        g = np.asarray(grads_out[0], dtype=np.float64).sum(axis=_reduce_axes(x_shape, case.p["out"]))
        return [g.reshape(x_shape)]

    def tolerance(self, case: Case) -> Tuple[float, float]:
        if case.direction == "fwd":
            return (0.0, 0.0)  # a copy: bit-exact for every dtype
        rtol, atol = DEFAULT_TOLERANCE[case.dtype]
        # Sums of `red` terms of |dy| <= 1 accumulated in float32 (float64 for float64): allow a few roundings
        # of the accumulator per term; half-precision accumulation would be ~2^13 times further off.
        red = math.prod(case.p["out"]) // max(1, math.prod(case.shapes[0]))
        eps = 2.0 ** -53 if case.dtype == "float64" else 2.0 ** -24
        return (rtol, max(atol, 4 * eps * red))

    def forward(self, case: Case, api, xs) -> list:
        return [api.broadcast_to(xs[0], case.p["out"])]

    def naive_forward(self, case: Case, xs) -> list:
        x = xs[0]
        out = case.p["out"]
        lead = len(out) - x.ndim
        idx = ["0" if (x.shape[d] == 1 and out[d + lead] != 1) else f"i{d + lead}" for d in range(x.ndim)]
        return [x.reindex(list(out), idx)]

    def jittor_forward(self, case: Case, xs) -> list:
        return [xs[0].broadcast(list(case.p["out"]))]

    def torch_forward(self, case: Case, ts) -> list:
        return [ts[0].expand(*case.p["out"]).contiguous()]

    def bytes_moved(self, case: Case) -> int:
        return _codegen.ITEMSIZE[case.dtype] * (math.prod(case.shapes[0]) + math.prod(case.p["out"]))

    def variant(self, case: Case, api) -> str:
        if api is not importlib.import_module("ops"):
            return "-"
        from .. import broadcast
        x_shape, out = tuple(case.shapes[0]), tuple(case.p["out"])
        if case.direction == "fwd":
            return broadcast.select_config(x_shape, out, case.dtype).variant
        return broadcast.select_grad_config(x_shape, out, case.dtype).variant

    def cuda_launches(self, case: Case):
        """See ``Family.cuda_launches``."""
        from .. import broadcast
        x_shape, out, dt = tuple(case.shapes[0]), tuple(case.p["out"]), case.dtype
        bwd = case.direction == "bwd"
        launches = [(broadcast._plan(x_shape, dt, out, bwd, True).launch, [(dt, len(x_shape))], False)]
        if bwd:
            launches += [(broadcast.pass_launch(rp, True), [(rp.in_dtype, 1)], False)
                         for rp in broadcast.select_grad_config(x_shape, out, dt).passes]
        return launches


def _both(name, x_shape, out, dtypes, devices):
    return [case(NAME, f"{name}-{dt}", d, [x_shape], dt, devices=devices, out=tuple(out))
            for dt in dtypes for d in ("fwd", "bwd")]


_GPU = ("cuda",)
_CPU = ("cpu",)
_F = ("float32", "float16")

CASES = (
    # Paddle OP-benchmark shapes (seed 002), fp32 and fp16
    _both("paddle0-1785x1-to-1785x128", (1785, 1), (1785, 128), _F, _GPU)
    + _both("paddle1-5x1x1-to-5x128x128", (5, 1, 1), (5, 128, 128), _F, _GPU)
    + _both("paddle2-32x807x1-to-32x807x807", (32, 807, 1), (32, 807, 807), _F, _GPU)
    + _both("paddle6-16x1x1-to-16x807x807", (16, 1, 1), (16, 807, 807), _F, _GPU)
    + _both("paddle7-32x1x1-to-32x256x256", (32, 1, 1), (32, 256, 256), _F, _GPU)
    # a middle-dim expand (kept, broadcast, kept), 256 MB fp32 output
    + _both("middle-64x1x1024-to-64x1024x1024", (64, 1, 1024), (64, 1024, 1024), _F, _GPU)
    # a scalar expand, 256 MB fp32 output (backward: one huge reduction, split + second pass)
    + _both("scalar-1-to-8192x8192", (1,), (8192, 8192), ("float32",), _GPU)
    # 256 MB outputs: rows filled (fill / row reduction) and tiles repeated (tile / column reduction)
    + _both("rows-8192x1-to-8192x8192", (8192, 1), (8192, 8192), ("float32",), _GPU)
    + _both("tile-1x8192-to-8192x8192", (1, 8192), (8192, 8192), ("float32",), _GPU)
    + _both("tile-1x8192-to-16384x8192", (1, 8192), (16384, 8192), ("float16",), _GPU)
    # both ends broadcast (B, K, B): a row pass then a column pass
    + _both("ends-1x256x1-to-64x256x1024", (1, 256, 1), (64, 256, 1024), ("float32",), _GPU)
    # CPU-sized versions of the same patterns
    + _both("paddle0-1785x1-to-1785x128", (1785, 1), (1785, 128), _F, _CPU)
    + _both("paddle1-5x1x1-to-5x128x128", (5, 1, 1), (5, 128, 128), _F, _CPU)
    + _both("small2-8x807x1-to-8x807x81", (8, 807, 1), (8, 807, 81), ("float32",), _CPU)
    + _both("small6-4x1x1-to-4x207x807", (4, 1, 1), (4, 207, 807), ("float32",), _CPU)
    + _both("middle-8x1x256-to-8x128x256", (8, 1, 256), (8, 128, 256), ("float32",), _CPU)
    + _both("scalar-1-to-512x512", (1,), (512, 512), ("float32",), _CPU)
    + _both("tile-1x256-to-1024x256", (1, 256), (1024, 256), ("float16",), _CPU)
    + _both("ends-1x16x1-to-8x16x512", (1, 16, 1), (8, 16, 512), ("float32",), _CPU)
)


def _edge(name, x_shape, out, dtype, devices, direction):
    return case(NAME, f"{name}-{dtype}", direction, [x_shape], dtype, devices=devices, out=tuple(out), values=EDGE)


# Ties, NaN, +-Inf and -0.0: copied bit for bit forward; summed as IEEE does backward (NaN or Inf where a
# reduction meets one).
EDGE_CASES = [
    _edge("paddle0-edge-1785x1-to-1785x128", (1785, 1), (1785, 128), "float32", _CPU, "fwd"),
    _edge("tile-edge-1x256-to-1024x256", (1, 256), (1024, 256), "float16", _CPU, "fwd"),
    _edge("paddle0-edge-1785x1-to-1785x128", (1785, 1), (1785, 128), "float32", _CPU, "bwd"),
    _edge("middle-edge-8x1x256-to-8x128x256", (8, 1, 256), (8, 128, 256), "float16", _CPU, "bwd"),
    _edge("paddle2-edge-32x807x1-to-32x807x807", (32, 807, 1), (32, 807, 807), "float16", _GPU, "fwd"),
    _edge("middle-edge-64x1x1024-to-64x1024x1024", (64, 1, 1024), (64, 1024, 1024), "float32", _GPU, "fwd"),
    _edge("paddle2-edge-32x807x1-to-32x807x807", (32, 807, 1), (32, 807, 807), "float32", _GPU, "bwd"),
    _edge("tile-edge-1x8192-to-8192x8192", (1, 8192), (8192, 8192), "float32", _GPU, "bwd"),
]

FAMILY = ExpandAsFamily(name=NAME, cases=list(CASES), edge_cases=EDGE_CASES)
