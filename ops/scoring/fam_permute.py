"""Cases for permute / transpose (``op="permute"``, param ``perm``) and the fused transpose + add
(``op="transpose_add"``, params ``dim0``, ``dim1``; inputs x and y with the transposed shape)."""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np

from .._codegen import ITEMSIZE
from .judge import Expected
from .spec import DEFAULT_TOLERANCE, EDGE, Family, case, round_to_bfloat16


def _impl():
    """ops/permutation.py, imported when a case first needs it (importing it imports jittor)."""
    from .. import permutation
    return permutation


def _perm(c) -> Tuple[int, ...]:
    p = c.p
    if p.get("op", "permute") == "permute":
        return tuple(p["perm"])
    n = len(c.shapes[0])
    perm = list(range(n))
    perm[p["dim0"]], perm[p["dim1"]] = perm[p["dim1"]], perm[p["dim0"]]
    return tuple(perm)


def _inverse(perm):
    inv = [0] * len(perm)
    for k, p in enumerate(perm):
        inv[p] = k
    return tuple(inv)


def _wide(dtype: str):
    return np.float64 if dtype in ("float32", "float64") else np.float32


def rounded_want(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """The correctly rounded a + b in ``dtype`` for float arrays of ``dtype`` (bfloat16 held in float32). The sum
    is taken in a wider float and rounded once more: that wider float has at least 2p + 2 significand bits for
    the dtype's p, so the double rounding gives the correctly rounded sum (float16 and bfloat16 in float32,
    float32 in float64; float64 sums in float64)."""
    wide = _wide(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        total = a.astype(wide, copy=False) + b.astype(wide, copy=False)
        return round_to_bfloat16(total) if dtype == "bfloat16" else total.astype(dtype)


def sum_side(a: np.ndarray, b: np.ndarray, want: np.ndarray, dtype: str) -> np.ndarray:
    """The sign of the exact a + b minus ``want`` (its rounding in ``dtype``) as int8 (NaN: 0). It comes from
    the wide add's exact error (TwoSum) as well as from the second rounding: a wide sum that rounded onto the
    narrow result (1 + 2**-30 in float32 for bfloat16) still has an inexact side."""
    wide = _wide(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        a, b = a.astype(wide, copy=False), b.astype(wide, copy=False)
        total = a + b
        # |total - want| is 0 or at least one wide ulp of total, more than the wide add's error: it decides
        # where it is not 0; where it is, the add's exact error (TwoSum) does
        residual = np.subtract(total, want.astype(wide), order="C")  # C order: the flat view below writes it
        on = np.flatnonzero(residual.reshape(-1) == 0)
        if on.size:
            ta, tb, tt = a.ravel()[on], b.ravel()[on], total.ravel()[on]
            back = tt - ta
            residual.reshape(-1)[on] = (ta - (tt - back)) + (tb - back)
    return np.subtract(residual > 0, residual < 0, dtype=np.int8)


def rounded_sum(a: np.ndarray, b: np.ndarray, dtype: str):
    """(``rounded_want``, ``sum_side``) of a + b."""
    want = rounded_want(a, b, dtype)
    return want, sum_side(a, b, want, dtype)


class PermuteFamily(Family):
    def _is_add(self, c) -> bool:
        return c.p.get("op", "permute") == "transpose_add"

    # --- references ------------------------------------------------------------------------------------------
    def reference_forward(self, c, arrays):
        perm = _perm(c)
        x = np.transpose(arrays[0], perm)
        if not self._is_add(c):
            return [x.astype(np.float64) if x.dtype.kind == "f" else x]
        if x.dtype.kind == "f":
            return [x.astype(np.float64) + arrays[1].astype(np.float64)]
        return [x + arrays[1]]  # ints wrap in their dtype, bool adds as logical or: what the kernels do

    def reference_backward(self, c, arrays, grads_out):
        g = grads_out[0].astype(np.float64)
        grads = {0: np.transpose(g, _inverse(_perm(c)))}
        if self._is_add(c):
            grads[1] = g
        return [grads[i] for i in c.grad_of]

    def output_shapes(self, c):
        return [tuple(c.shapes[0][p] for p in _perm(c))]

    def expected(self, c, arrays, grads_out=None):
        """Moved values bit for bit, -0.0 told from 0.0 (a copy keeps the sign); transpose_add of floats
        faithfully rounded (its one IEEE add rounds once: the correctly rounded sum, or the neighbour on the
        exact sum's side, as a conversion that truncates gives: jittor's CPU bfloat16); of integers and bool
        exactly (ints wrap, bool adds as logical or)."""
        return [block(slice(None)) for _, block in self._outputs(c, arrays, grads_out)]

    def judged_in_rows(self, c):
        return c.direction == "fwd" or len(c.grad_of) == 1

    def expected_rows(self, c, arrays, grads_out):
        outputs = self._outputs(c, arrays, grads_out)
        return outputs[0] if len(outputs) == 1 else None

    def _outputs(self, c, arrays, grads_out):
        """Each output as (its length along the first axis, what a block of its rows must be): rows of the
        output are rows of the moved operand (a view) and of the added one."""
        if c.direction == "bwd":
            g = grads_out[0]
            grads = {0: np.transpose(g, _inverse(_perm(c))), 1: g}

            def rows_of(grad):
                return grad.shape[0], lambda rows: Expected(grad[rows], (c.dtype,), signed_zero=True)
            return [rows_of(grads[i]) for i in c.grad_of]
        moved = np.transpose(arrays[0], _perm(c))
        added = arrays[1] if self._is_add(c) else None
        return [(moved.shape[0],
                 lambda rows: self._forward_expected(c, moved[rows], None if added is None else added[rows]))]

    def _forward_expected(self, c, moved, added):
        if added is None:
            return Expected(moved, (c.dtype,), signed_zero=True)
        if moved.dtype.kind != "f":
            return Expected(moved + added, (c.dtype,))
        # The side only where the output is not the rounded sum itself (judge: a callable bound): for a right
        # output that is nowhere, and its cost (TwoSum over every element) is most of a judge's.
        want = rounded_want(moved, added, c.dtype)

        def side_at(flat):
            at = np.unravel_index(flat, want.shape)
            return sum_side(moved[at], added[at], want[at], c.dtype)
        return Expected(want, (c.dtype,), "faithful", side_at)

    def tolerance(self, c):
        if c.dtype not in DEFAULT_TOLERANCE:
            return (0.0, 0.0)
        if not self._is_add(c):
            return (0.0, 0.0)  # a permute moves values: exact
        return DEFAULT_TOLERANCE[c.dtype]

    # --- implementations -----------------------------------------------------------------------------------
    def forward(self, c, api, xs):
        if self._is_add(c):
            return [api.transpose_add(xs[0], xs[1], c.p["dim0"], c.p["dim1"])]
        return [api.permute(xs[0], *_perm(c))]

    def naive_forward(self, c, xs):
        perm = _perm(c)
        inv = _inverse(perm)
        shape = [xs[0].shape[p] for p in perm]
        moved = xs[0].reindex(shape, [f"i{inv[d]}" for d in range(len(perm))])
        return [moved + xs[1]] if self._is_add(c) else [moved]

    def jittor_forward(self, c, xs):
        if self._is_add(c):
            return [xs[0].transpose(c.p["dim0"], c.p["dim1"]) + xs[1]]
        return [xs[0].permute(*_perm(c))]

    def torch_forward(self, c, ts):
        if self._is_add(c):
            return [ts[0].transpose(c.p["dim0"], c.p["dim1"]) + ts[1]]
        return [ts[0].permute(*_perm(c)).contiguous()]

    # --- cost model --------------------------------------------------------------------------------------------
    def bytes_moved(self, c):
        n = math.prod(c.shapes[0]) * ITEMSIZE[c.dtype]
        return (3 if self._is_add(c) else 2) * n

    def variant(self, c, api):
        import ops
        if api is not ops:
            return "-"
        op = "transpose_add" if self._is_add(c) else "permute"
        cfg = _impl().select_config(c.shapes[0], _perm(c), c.dtype, op)
        extra = (f" P{cfg.pack}" if cfg.pack > 1 else "") + (" splitB" if cfg.data.get("split_b") else "") + (
            " loose" if cfg.data.get("loose") else "")
        return f"{cfg.variant}{extra} r{cfg.rank} {cfg.chunk}B"

    def cuda_launches(self, c):
        """See ``Family.cuda_launches``."""
        impl, dt = _impl(), c.dtype
        if self._is_add(c):
            p = impl._transpose_add_plan(tuple(c.shapes[0]), dt, _perm(c), c.direction == "bwd", True)
            launches = [(p.launch, [(dt, 1), (dt, 1)], False)]
        else:
            p = impl._permute_plan(tuple(c.shapes[0]), dt, _perm(c), c.direction == "bwd", True)
            launches = [(p.launch, [(dt, 1)], False)]
        if c.direction == "bwd":
            launches.append((p.backward_plan().launch, [(dt, 1)], False))
        return launches


def _p(name, direction, shape, dtype, perm, devices=("cuda",), **extra):
    return case("permute", name, direction, [shape], dtype, devices=devices, op="permute", perm=tuple(perm),
                **extra)


def _ta(name, direction, shape, dtype, dim0=0, dim1=1, devices=("cuda",), grad_of=(0,), **extra):
    y = list(shape)
    y[dim0], y[dim1] = y[dim1], y[dim0]
    return case("permute", name, direction, [shape, tuple(y)], dtype, devices=devices, grad_of=grad_of,
                op="transpose_add", dim0=dim0, dim1=dim1, **extra)


CPU = ("cpu",)

CASES = [
    # OneFlow's (0,1,2) -> (1,0,2), 16 to 128 MB
    _p("102_f32_16MB", "fwd", (1024, 512, 8), "float32", (1, 0, 2)),
    _p("102_f32_128MB", "fwd", (2048, 1024, 16), "float32", (1, 0, 2)),
    _p("102_f16_64MB", "fwd", (2048, 1024, 16), "float16", (1, 0, 2)),
    # OneFlow's batch transpose (0,2,1)
    _p("021_f32_16MB", "fwd", (16, 512, 512), "float32", (0, 2, 1)),
    _p("021_f32_128MB", "fwd", (32, 1024, 1024), "float32", (0, 2, 1)),
    _p("021_f16_16MB", "fwd", (32, 512, 512), "float16", (0, 2, 1)),
    _p("021_f16_64MB", "fwd", (32, 1024, 1024), "float16", (0, 2, 1)),
    _p("021_bf16_64MB", "fwd", (32, 1024, 1024), "bfloat16", (0, 2, 1)),
    # attention (B,S,H,D) -> (B,H,S,D)
    _p("attn_bshd_f16", "fwd", (32, 512, 16, 64), "float16", (0, 2, 1, 3)),
    _p("attn_bshd_f32", "fwd", (16, 1024, 16, 64), "float32", (0, 2, 1, 3)),
    # 4-D (2,3,0,1), odd 2-D, 5-D general
    _p("2301_f32", "fwd", (64, 64, 128, 128), "float32", (2, 3, 0, 1)),
    _p("odd_4097x3071_f32", "fwd", (4097, 3071), "float32", (1, 0)),
    _p("odd_4097x3071_f16", "fwd", (4097, 3071), "float16", (1, 0)),
    _p("5d_04213_f32", "fwd", (16, 32, 16, 32, 32), "float32", (0, 4, 2, 1, 3)),
    _p("5d_31420_f16", "fwd", (8, 24, 40, 16, 64), "float16", (3, 1, 4, 2, 0)),
    # other dtypes
    _p("021_int8", "fwd", (64, 1024, 1024), "int8", (0, 2, 1)),
    _p("021_bool", "fwd", (32, 1024, 1024), "bool", (0, 2, 1)),
    _p("10_int64", "fwd", (4096, 4096), "int64", (1, 0)),
    _p("102_int64", "fwd", (1024, 1024, 8), "int64", (1, 0, 2)),
    _p("odd_4097x3071_int8", "fwd", (4097, 3071), "int8", (1, 0)),  # 1-byte rows off a word: loose words
    # backward (the inverse permutation through the same kernels)
    _p("021_f32_128MB", "bwd", (32, 1024, 1024), "float32", (0, 2, 1)),
    _p("attn_bshd_f16", "bwd", (32, 512, 16, 64), "float16", (0, 2, 1, 3)),
    _p("5d_04213_f32", "bwd", (16, 32, 16, 32, 32), "float32", (0, 4, 2, 1, 3)),
    # transpose + add
    _ta("ta_24300x11520_bf16", "fwd", (24300, 11520), "bfloat16"),
    _ta("ta_8192x8192_f32", "fwd", (8192, 8192), "float32"),
    _ta("ta_odd_4097x3071_f16", "fwd", (4097, 3071), "float16"),
    _ta("ta_odd_4097x3071_f32", "fwd", (4097, 3071), "float32"),
    _ta("ta_batched_f32", "fwd", (16, 1024, 1024), "float32", 1, 2),
    _ta("ta_batched_f16", "fwd", (32, 1024, 1024), "float16", 1, 2),
    _ta("ta_8192x8192_f32", "bwd", (8192, 8192), "float32", grad_of=(0, 1)),
    _ta("ta_24300x11520_bf16", "bwd", (24300, 11520), "bfloat16", grad_of=(0, 1)),
    # CPU-sized
    _p("cpu_021_f32", "fwd", (8, 96, 80), "float32", (0, 2, 1), CPU),
    _p("cpu_2301_f32", "fwd", (5, 6, 7, 8), "float32", (2, 3, 0, 1), CPU),
    _p("cpu_102_f32", "fwd", (64, 48, 16), "float32", (1, 0, 2), CPU),
    _p("cpu_odd_f16", "fwd", (257, 191), "float16", (1, 0), CPU),
    _p("cpu_attn_f16", "fwd", (4, 64, 8, 32), "float16", (0, 2, 1, 3), CPU),
    _p("cpu_021_bf16", "fwd", (4, 64, 96), "bfloat16", (0, 2, 1), CPU),
    _p("cpu_5d_f32", "fwd", (4, 8, 6, 16, 16), "float32", (0, 4, 2, 1, 3), CPU),
    _p("cpu_10_int8", "fwd", (256, 192), "int8", (1, 0), CPU),
    _p("cpu_021_bool", "fwd", (3, 40, 50), "bool", (0, 2, 1), CPU),
    _p("cpu_10_int64", "fwd", (96, 80), "int64", (1, 0), CPU),
    _p("cpu_021_f32", "bwd", (8, 96, 80), "float32", (0, 2, 1), CPU),
    _ta("cpu_ta_bf16", "fwd", (243, 116), "bfloat16", devices=CPU),
    _ta("cpu_ta_f32", "fwd", (256, 192), "float32", devices=CPU),
    _ta("cpu_ta_odd_f16", "fwd", (97, 71), "float16", devices=CPU),
    _ta("cpu_ta_batched_f32", "fwd", (4, 64, 96), "float32", 1, 2, devices=CPU),
    _ta("cpu_ta_f32", "bwd", (256, 192), "float32", devices=CPU, grad_of=(0, 1)),
]

# Ties, NaN, +-Inf and -0.0: copies keep every bit (but NaN payloads), transpose_add adds them as IEEE does.
EDGE_CASES = [
    _p("cpu_021_f32_edge", "fwd", (8, 96, 80), "float32", (0, 2, 1), CPU, values=EDGE),
    _p("cpu_odd_f16_edge", "fwd", (257, 191), "float16", (1, 0), CPU, values=EDGE),
    _p("cpu_021_f32_edge", "bwd", (8, 96, 80), "float32", (0, 2, 1), CPU, values=EDGE),
    _ta("cpu_ta_f32_edge", "fwd", (256, 192), "float32", devices=CPU, values=EDGE),
    _ta("cpu_ta_bf16_edge", "fwd", (243, 116), "bfloat16", devices=CPU, values=EDGE),
    _p("021_f32_edge_16MB", "fwd", (16, 512, 512), "float32", (0, 2, 1), values=EDGE),
    _p("attn_bshd_edge_bf16", "fwd", (32, 512, 16, 64), "bfloat16", (0, 2, 1, 3), values=EDGE),
    _p("5d_04213_edge_f32", "bwd", (16, 32, 16, 32, 32), "float32", (0, 4, 2, 1, 3), values=EDGE),
    _ta("ta_odd_edge_4097x3071_f32", "fwd", (4097, 3071), "float32", values=EDGE),
    _ta("ta_batched_edge_f16", "fwd", (32, 1024, 1024), "float16", 1, 2, values=EDGE),
]

FAMILY = PermuteFamily(name="permute", cases=CASES, edge_cases=EDGE_CASES)
