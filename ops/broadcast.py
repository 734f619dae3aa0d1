"""expand_as / broadcast_to: a materialized broadcast and its deterministic reduce-sum gradient.

Math. For ``x`` of shape ``xs`` broadcast to ``out`` (NumPy rules, ``xs`` left-padded with 1s):
``y[i_0, ..., i_{n-1}] = x[j_0, ..., j_{n-1}]`` with ``j_d = 0`` where ``xs[d] == 1 != out[d]`` (a broadcast dim)
and ``j_d = i_d`` elsewhere (a kept dim). Backward: ``dx = sum of dy over every broadcast dim``, reshaped to
``xs``; float16/bfloat16 accumulate in float32, float32 in float32, float64 in float64. No atomics: the
summation order is a function of the shape, the dtype and (CUDA row passes, which split each row at 16-byte
boundaries) dy's address modulo 16 bytes, so the same ``dy`` gives bit-identical ``dx`` run after run.

Layers: shape algebra (``broadcast_shape``, ``simplify_broadcast``) -> ``select_config`` (forward) and
``select_grad_config`` (a chain of reduction passes) -> ``forward_launch`` / ``pass_launch`` (``jt.code``: CUDA
kernels of ``cuda_snippets/broadcast.cuh`` through generated menus, the CPU path in
``cuda_snippets/broadcast_cpu.h`` with the same index math) -> a plan per call signature
(``ops._launch.PlanCache``; the backward recorded with ``_launch.taped``) -> ``broadcast_to`` / ``expand_as`` ->
``ExpandAs`` (jt.Module).
"""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from . import _codegen
from . import _launch
from ._args import as_index_sequence, check_rank
from ._calls import opening1, opening_shaped, reshape as _reshape
from ._jittor import jt

Shape = Tuple[int, ...]

__all__ = ["broadcast_to", "expand_as", "ExpandAs", "broadcast_shape", "simplify_broadcast",
           "select_config", "select_grad_config", "KernelConfig", "ReducePass", "GradConfig",
           "FORWARD_VARIANTS", "GRAD_VARIANTS"]

FORWARD_VARIANTS = ("fill", "tile", "nd")
GRAD_VARIANTS = ("identity", "row_small", "row_warp", "row_block", "row_split", "col", "col_split")

# --- tuning constants (all predicted; to measure on the GPU) ---------------------------------------------------
# 256 threads: 8 warps per block, 8 resident blocks per SM on sm_90 = full occupancy for these register-light
# kernels. Predicted: any of 128..512 within a few percent; to measure.
BLOCK = 256
# Forward: 4 vectors of 16 bytes per thread. Predicted: amortizes the block start and index setup over 4 stores
# without starving small outputs of blocks (1 MB of fp32 output is still 64 blocks); to measure.
FWD_UNROLL = 4
# Forward kernels are compiled for these group counts; a pattern of 5..10 groups (rank >= 5, rare) runs the
# 10-group kernel behind leading size-1 groups (one extra fast division each). Cuts the instantiations per
# (element size, index type, inner kind) from 10 to 5, halving nvcc time of the compile test.
FWD_ND_BUCKETS = (1, 2, 3, 4, 10)
# Split reductions aim at about this many blocks: ~4 per SM on a 132-SM H200, i.e. 32 warps per SM with four
# 16-byte loads in flight per thread = 64 KB in flight per SM, above the ~40 KB that HBM latency x bandwidth
# needs. Fewer blocks leave bandwidth unused (a lone block streams ~10-20 GB/s); more only add partial sums.
# Predicted; to measure.
TARGET_BLOCKS = 512
# Row pass lane groups, by the row length in 16-byte chunks: rows of <= 8 chunks get 4 lanes (a warp would
# idle >= 24 lanes), rows of <= 512 chunks a warp (<= 16 chunks per lane), longer rows a 256-thread block.
# Predicted: keeps >= 50% of lanes loading in every case; to measure.
ROW_SMALL_MAX_CHUNKS = 8
ROW_WARP_MAX_CHUNKS = 512
# A row is split only when one 256-thread block would loop over more than 16 chunks per thread (4 rounds of 4
# loads in flight, a few microseconds: about what one more jt.code pass costs in host time), and a split
# segment keeps >= 4 chunks per thread (1024 chunks = 16 KB). Predicted; to measure.
ROW_SPLIT_MIN_CHUNKS = 256 * 16
ROW_MIN_SEG_CHUNKS = 1024
# A split row pass runs as one launch (ops_bcast_row_split: the last block of a row adds its partial sums),
# with one integer counter per row in a fixed device array of this size (OPS_BCAST_SPLIT_MAX_ROWS). Rows are
# split only when there are fewer than TARGET_BLOCKS of them, so this bound always holds.
SPLIT_MAX_ROWS = 512
# Column pass: a block is 32 column-threads x 8 row-threads. It is split only when a row-thread would loop over
# more than 16 rows, and a split segment gives each row-thread >= 8 rows (two rounds of 4 loads in flight).
# Predicted: shorter segments make the partial-sum pass dominate; to measure.
COL_ROW_THREADS = 8
COL_COL_THREADS = 32
COL_SPLIT_MIN_ROWS = COL_ROW_THREADS * 16
COL_MIN_SEG_ROWS = COL_ROW_THREADS * 8

ITEMSIZE = _codegen.ITEMSIZE  # every jittor dtype and its size
ACC_DTYPE = {"float16": "float32", "bfloat16": "float32", "float32": "float32", "float64": "float64"}
_ACC_CTYPE = {"float32": "float", "float64": "double"}


# ==============================================================================================================
# Shape algebra (pure Python)
# ==============================================================================================================
def _fmt(shape) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _as_shape(shape, name: str) -> Shape:
    """``shape`` as a tuple of ints: a sequence (tuple, list, jittor's NanoVector ``x.shape``, ...) of ints in
    any form ``_args.as_index`` takes, or one such int; TypeError naming ``name`` otherwise."""
    if type(shape) in (tuple, list) and all(type(s) is int for s in shape):  # the common case, without checks
        return tuple(shape)
    if isinstance(shape, jt.Var):
        raise TypeError(f"{name} must be a sequence of ints, got a jittor Var (pass its .shape for its shape)")
    if not isinstance(shape, (bool, str, bytes)):
        try:
            return (operator.index(shape),)
        except TypeError:
            pass
    return as_index_sequence(shape, name)


@functools.lru_cache(maxsize=4096)
def broadcast_shape(x_shape: Shape, shape: Shape, x_name: str = "x", shape_name: str = "shape") -> Shape:
    """The output shape of broadcasting ``x_shape`` to ``shape`` (NumPy rules; ``-1`` keeps x's size).

    Raises ValueError naming both shapes when they are incompatible.
    """
    x_shape, shape = tuple(x_shape), tuple(shape)
    where = f"cannot broadcast {x_name} of shape {_fmt(x_shape)} to {shape_name} {_fmt(shape)}"
    if len(shape) < len(x_shape):
        raise ValueError(f"{where}: {shape_name} has fewer dimensions ({len(shape)}) than {x_name} "
                         f"({len(x_shape)})")
    lead = len(shape) - len(x_shape)
    out = []
    for d, s in enumerate(shape):
        if d < lead:
            if s < 0:
                raise ValueError(f"{where}: {shape_name}[{d}] = {s}; -1 only keeps a dimension {x_name} has, "
                                 f"and sizes cannot be negative")
            out.append(s)
            continue
        xd = x_shape[d - lead]
        if s == -1:
            out.append(xd)
        elif s < 0:
            raise ValueError(f"{where}: {shape_name}[{d}] = {s} is negative")
        elif xd == s or xd == 1:
            out.append(s)
        else:
            raise ValueError(f"{where}: dimension {d} of {shape_name} is {s} but {x_name} has {xd} there "
                             f"(only size-1 dimensions can be expanded)")
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def simplify_broadcast(x_shape: Shape, out_shape: Shape) -> Tuple[Shape, Tuple[bool, ...]]:
    """Simplified (dims, is_broadcast) of a valid broadcast of ``x_shape`` to ``out_shape``.

    Size-1 output dims are dropped and neighbouring dims of the same kind merged, so kinds alternate.
    A one-element output gives ``((1,), (False,))``; an empty one ``((0,), (False,))``.
    """
    x_shape, out_shape = tuple(x_shape), tuple(out_shape)
    if any(s == 0 for s in out_shape):
        return (0,), (False,)
    padded = (1,) * (len(out_shape) - len(x_shape)) + x_shape
    dims, kinds = [], []
    for xd, od in zip(padded, out_shape):
        if od == 1:
            continue
        bcast = xd == 1
        if kinds and kinds[-1] == bcast:
            dims[-1] *= od
        else:
            dims.append(od)
            kinds.append(bcast)
    if not dims:
        return (1,), (False,)
    return tuple(dims), tuple(kinds)


# ==============================================================================================================
# Forward config
# ==============================================================================================================
@dataclass(frozen=True)
class KernelConfig:
    """One forward launch: ``ops_bcast_forward<T, ND, INNER_BCAST, INDEX_T, BLOCK, UNROLL>``.

    ``variant``: ``fill`` (<= 2 groups, innermost broadcast: rows filled from one value), ``tile`` (<= 2 groups,
    innermost kept: repeated copies of x), ``nd`` (3+ groups). ``dims``/``in_strides``: the simplified groups,
    padded in front to a size of ``FWD_ND_BUCKETS``. Compile-time: ``nd`` (= len(dims)),
    ``inner_bcast``, ``index_type``, ``block``, ``unroll``. Runtime (``data``): dims, strides, grid.
    """

    variant: str
    dims: Shape
    in_strides: Shape
    inner_bcast: bool
    numel: int
    vec: int
    index_type: str
    block: int
    unroll: int
    grid: int

    @property
    def nd(self) -> int:
        return len(self.dims)

    @property
    def in_dims(self) -> Shape:
        """x's shape as the kernel sees it: the simplified groups, 1 on broadcast (stride-0) groups."""
        return tuple(n if s else 1 for n, s in zip(self.dims, self.in_strides))

    def data(self) -> Dict[str, float]:
        """The runtime values for ``jt.code(data=...)``."""
        d = {"grid": self.grid, "nd": self.nd}
        for i, (n, s) in enumerate(zip(self.dims, self.in_strides)):
            d[f"d{i}"] = n
            d[f"s{i}"] = s
        return d


@functools.lru_cache(maxsize=4096)
def select_config(x_shape: Shape, out_shape: Shape, dtype: str, index_type: Optional[str] = None) -> KernelConfig:
    """Forward launch for broadcasting ``x_shape`` to ``out_shape`` (valid, non-empty) in ``dtype``.

    ``index_type`` ("int" / "long long") overrides the automatic choice (tests use it to run the int64 path).
    """
    dims, kinds = simplify_broadcast(tuple(x_shape), tuple(out_shape))
    strides, run = [], 1
    for n, b in zip(reversed(dims), reversed(kinds)):
        strides.append(0 if b else run)
        if not b:
            run *= n
    strides.reverse()
    numel = math.prod(out_shape)
    vec = 16 // ITEMSIZE[dtype]
    if len(dims) >= 3:
        variant = "nd"
    else:
        variant = "fill" if kinds[-1] else "tile"
    pad = min(b for b in FWD_ND_BUCKETS if b >= len(dims)) - len(dims)
    grid = max(1, -(-(numel // vec) // (BLOCK * FWD_UNROLL)))
    return KernelConfig(variant=variant, dims=(1,) * pad + dims, in_strides=(0,) * pad + tuple(strides),
                        inner_bcast=kinds[-1],
                        numel=numel, vec=vec, index_type=index_type or _codegen.index_type(numel),
                        block=BLOCK, unroll=FWD_UNROLL, grid=grid)


# ==============================================================================================================
# Backward config: a chain of reduction passes
# ==============================================================================================================
@dataclass(frozen=True)
class ReducePass:
    """One reduction launch over a flat input.

    ``row``: input [outer, red]; segment s of row r (``seg_len`` elements) -> out[r * segments + s];
    ``group`` lanes per segment (4, 32 or 256). ``row_split``: input [outer, red] -> out[r], one 256-lane block
    per segment and the row's segment sums added in order by its last block (one launch).
    ``col``: input [outer, red, inner]; segment s of the middle dim
    (``seg_len`` rows) -> out[(n * segments + s) * inner + j]. ``segments > 1`` writes partial sums that a
    later pass of the chain reduces.
    """

    name: str
    kind: str
    outer: int
    red: int
    inner: int
    segments: int
    seg_len: int
    group: int
    in_dtype: str
    out_dtype: str
    acc_dtype: str
    index_type: str
    tiles: int
    grid: int

    @property
    def out_numel(self) -> int:
        return self.outer if self.kind == "row_split" else self.outer * self.segments * self.inner

    def data(self) -> Dict[str, float]:
        if self.kind in ("row", "row_split"):
            return {"R": self.outer, "C": self.red, "S": self.segments, "L": self.seg_len, "grid": self.grid}
        return {"N": self.outer, "M": self.red, "J": self.inner, "S": self.segments, "Ms": self.seg_len,
                "tiles": self.tiles, "grid": self.grid}


@dataclass(frozen=True)
class GradConfig:
    """The backward of one broadcast: ``passes`` run in order (none: dx is dy reshaped)."""

    variant: str
    passes: Tuple[ReducePass, ...]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _row_passes(R: int, C: int, in_dt: str, out_dt: str, acc: str, itype: Optional[str]) -> list:
    vec = 16 // ITEMSIZE[in_dt]
    chunks = _cdiv(C, vec)
    it = itype or _codegen.index_type(R * C)
    if chunks <= ROW_SMALL_MAX_CHUNKS:
        group, name = 4, "row_small"
    elif chunks <= ROW_WARP_MAX_CHUNKS:
        group, name = 32, "row_warp"
    else:
        group, name = 256, "row_block"
    segments = 1
    if group == 256 and chunks > ROW_SPLIT_MIN_CHUNKS:
        segments = min(_cdiv(TARGET_BLOCKS, R), chunks // ROW_MIN_SEG_CHUNKS)
    if segments >= 2:
        assert R <= SPLIT_MAX_ROWS  # segments >= 2 needs R < TARGET_BLOCKS
        seg_len = _cdiv(chunks, segments) * vec  # segments start on 16-byte chunk boundaries of an aligned row
        segments = _cdiv(C, seg_len)
        return [ReducePass("row_split", "row_split", R, C, 1, segments, seg_len, group, in_dt, out_dt, acc, it, 0,
                           R * segments)]
    return [ReducePass(name, "row", R, C, 1, 1, C, group, in_dt, out_dt, acc, it, 0, _cdiv(R, BLOCK // group))]


def _col_passes(N: int, M: int, J: int, in_dt: str, out_dt: str, acc: str, itype: Optional[str]) -> list:
    vec = 16 // ITEMSIZE[in_dt]
    tiles = _cdiv(J, COL_COL_THREADS * vec)
    it = itype or _codegen.index_type(N * M * J)
    segments = 1
    if M > COL_SPLIT_MIN_ROWS:
        segments = min(_cdiv(TARGET_BLOCKS, tiles * N), M // COL_MIN_SEG_ROWS)
    if segments >= 2:
        seg_len = _cdiv(M, segments)
        segments = _cdiv(M, seg_len)
        first = ReducePass("col_split", "col", N, M, J, segments, seg_len, 0, in_dt, acc, acc, it, tiles,
                           tiles * N * segments)
        return [first] + _col_passes(N, segments, J, acc, out_dt, acc, itype)
    return [ReducePass("col", "col", N, M, J, 1, M, 0, in_dt, out_dt, acc, it, tiles, tiles * N)]


@functools.lru_cache(maxsize=4096)
def select_grad_config(x_shape: Shape, out_shape: Shape, dtype: str, grad_dtype: Optional[str] = None,
                       index_type: Optional[str] = None) -> GradConfig:
    """Reduction chain computing dx (``dtype``) from dy (``grad_dtype``, default ``dtype``).

    Each pass removes one broadcast group, largest first (it shrinks the data the later passes read): the last
    group by a row pass, an inner one by a column pass; a pass over too few rows/columns to fill the GPU is
    split into partial sums plus a pass over them. Intermediate sums are kept in the accumulation dtype.
    """
    dims, kinds = simplify_broadcast(tuple(x_shape), tuple(out_shape))
    acc = ACC_DTYPE[dtype]
    cur = grad_dtype or dtype
    groups = [[n, b] for n, b in zip(dims, kinds)]
    passes = []
    while any(b for _, b in groups):
        i = max((g[0], k) for k, g in enumerate(groups) if g[1])[1]
        outer = math.prod(g[0] for g in groups[:i])
        inner = math.prod(g[0] for g in groups[i + 1:])
        last = sum(1 for g in groups if g[1]) == 1
        out_dt = dtype if last else acc
        if i == len(groups) - 1:
            passes += _row_passes(outer, groups[i][0], cur, out_dt, acc, index_type)
        else:
            passes += _col_passes(outer, groups[i][0], inner, cur, out_dt, acc, index_type)
        cur = out_dt
        del groups[i]
        if 0 < i < len(groups) and groups[i - 1][1] == groups[i][1]:
            groups[i - 1][0] *= groups[i][0]
            del groups[i]
    variant = "+".join(p.name for p in passes) if passes else "identity"
    return GradConfig(variant=variant, passes=tuple(passes))


# ==============================================================================================================
# Kernels: jt.code launches (CUDA from cuda_snippets/broadcast.cuh, CPU from cuda_snippets/broadcast_cpu.h)
# ==============================================================================================================
# ---- CUDA: menus -------------------------------------------------------------------------------------------
# One translation unit per (dtype, index type) for the forward: a generated menu switches over the (groups,
# inner broadcast) instantiations, the groups arriving through `data`; one per (input dtype, output dtype, index
# type) for the single-output reduction passes (row with 4 / 32 / 256 lanes, column); the split row pass (a
# second, scratch output) is its own.

FWD_MENU = _codegen.Menu([(nd, inner) for nd in FWD_ND_BUCKETS for inner in (True, False)],
                         lambda e: f"ops_bcast_forward_data<T, {e[0]}, {'true' if e[1] else 'false'}, I, {BLOCK}, "
                                   f"{FWD_UNROLL}>(in, out, numel, data)")
PASS_MENU = _codegen.Menu([("row", 4), ("row", 32), ("row", 256), ("col", 0)],
                          lambda e: f"ops_bcast_row_reduce_data<T, OutT, A, {e[1]}, I>(in, out, data)" if e[0] == "row"
                          else "ops_bcast_col_reduce_data<T, OutT, A, I>(in, out, data)")


@functools.lru_cache(maxsize=None)
def _cuda_header() -> str:
    text = ("// ops: expand_as menus (generated by ops/broadcast.py)\n#pragma once\n"
            + FWD_MENU.render("template <typename T, typename I, class Map>\n"
                              "void ops_bcast_forward_menu(int v, const T* in, T* out, long long numel, Map& data)",
                              "broadcast forward")
            + PASS_MENU.render("template <typename T, typename OutT, typename A, typename I, class Map>\n"
                               "void ops_bcast_pass_menu(int v, const T* in, OutT* out, Map& data)",
                               "broadcast reduction"))
    return _codegen.include(("common", "broadcast"), (_codegen.generated("broadcast_menus", text),))


_FWD_CUDA = "ops_bcast_forward_menu<in0_type, ${INDEX_T}>((int)data[\"v\"], in0_p, out0_p, out0->num, data);"
_PASS_CUDA = "ops_bcast_pass_menu<in0_type, out0_type, ${ACC}, ${INDEX_T}>((int)data[\"v\"], in0_p, out0_p, data);"
_ROW_SPLIT_CUDA = r"""
ops_bcast_row_split<in0_type, out0_type, ${ACC}, ${INDEX_T}>(
    in0_p, out0_p, out1_p, (long long)data["C"], (long long)data["S"], (long long)data["L"], (long long)data["grid"]);
"""

# ---- CPU: cuda_snippets/broadcast_cpu.h --------------------------------------------------------------------
# One compile per dtype (and per accumulator/output type for the passes). The forward and its backward take their
# groups from the Vars' shapes (no `data`, but for flat launches past CODE_MAX_RANK dims); the passes take theirs
# through `data`, packed (_launch.pack_fields).

_CPU_FWD = "OPS_BCAST_FWD;"  # the names broadcast_cpu.h defines (a short source keys and copies faster)
_CPU_GRAD = "OPS_BCAST_GRAD;"
_CPU_PASS = {"row": "OPS_BCAST_ROW(${ACC});", "row_split": "OPS_BCAST_ROW_SPLIT(${ACC});",
             "col": "OPS_BCAST_COL(${ACC});"}


def cpu_forward_data(cfg: KernelConfig) -> Dict[str, float]:
    """The CPU forward's ``data``: the simplified groups (without the GPU's padding to a bucket) and x's strides."""
    groups = [(n, st) for n, st in zip(cfg.dims, cfg.in_strides)]
    while len(groups) > 1 and groups[0] == (1, 0):
        groups.pop(0)
    data = {"n": len(groups)}
    for i, (n, st) in enumerate(groups):
        data[chr(ord("A") + i)], data[chr(ord("a") + i)] = n, st
    return data


def cpu_pass_data(p: ReducePass) -> Dict[str, float]:
    """A CPU reduction pass's ``data``."""
    if p.kind in ("row", "row_split"):
        return {"R": p.outer, "C": p.red, "S": p.segments, "L": p.seg_len}
    return {"N": p.outer, "M": p.red, "J": p.inner, "S": p.segments, "T": p.seg_len}


@functools.lru_cache(maxsize=None)
def _cpu_header() -> str:
    return _codegen.cpu_include("broadcast_cpu.h")


CODE_MAX_RANK = _launch.CODE_MAX_RANK


def forward_launch(cfg: KernelConfig, dtype: str, cuda: bool, out_shape: Shape,
                   need_grad: bool = True) -> _launch.Launch:
    """The forward: x (any shape: the kernel reads its elements in order) to the output of ``out_shape`` (flat
    past ``CODE_MAX_RANK`` dims). The GPU kernel takes the simplified groups through ``data``; the CPU one derives
    them from the Vars' shapes (``bcast_cpu::groups``), but for a flat launch, whose ``data`` holds them. On the
    CPU the backward rides along as a grad source when one may follow."""
    flat = len(out_shape) > CODE_MAX_RANK
    if flat:
        out_shape = (cfg.numel,)
    data = cfg.data()
    if cuda:
        data["v"] = FWD_MENU.index((cfg.nd, cfg.inner_bcast))
        src = _codegen.render(_FWD_CUDA, INDEX_T=cfg.index_type)
        return _launch.Launch(out_shape, dtype, cuda=True, src=src, header=_cuda_header(), data=data)
    grad_srcs = [_CPU_GRAD] if need_grad and dtype in ACC_DTYPE else None
    return _launch.Launch(out_shape, dtype, cuda=False, src=_CPU_FWD, header=_cpu_header(),
                          data=_launch.pack_fields(cpu_forward_data(cfg)) if flat else None, grad_srcs=grad_srcs)


def pass_launch(p: ReducePass, cuda: bool) -> _launch.Launch:
    """One reduction pass: the flat input to the flat partial or final sums (row_split: and its scratch)."""
    data = p.data()
    acc = _ACC_CTYPE[p.acc_dtype]
    if p.kind == "row_split":  # second output: the segment sums (scratch the kernel fills and reads back)
        shapes, dtypes = [(p.out_numel,), (p.outer * p.segments,)], [p.out_dtype, p.acc_dtype]
    else:
        shapes, dtypes = (p.out_numel,), p.out_dtype
    if not cuda:
        src, header = _codegen.render(_CPU_PASS[p.kind], ACC=acc), _cpu_header()
        data = _launch.pack_fields(cpu_pass_data(p))
    elif p.kind == "row_split":
        src, header = _codegen.render(_ROW_SPLIT_CUDA, ACC=acc, INDEX_T=p.index_type), _cuda_header()
    else:
        data["v"] = PASS_MENU.index(("row", p.group) if p.kind == "row" else ("col", 0))
        src, header = _codegen.render(_PASS_CUDA, ACC=acc, INDEX_T=p.index_type), _cuda_header()
    return _launch.Launch(shapes, dtypes, cuda=cuda, src=src, header=header, data=data)


def cast_rounded(v, dtype: str):
    """``v`` in ``dtype``; a float cast to bfloat16 is rounded to nearest even on every device (jittor's CPU cast
    truncates), through a row pass of one element per row."""
    src = str(v.dtype)
    if src == dtype:
        return v
    if dtype != "bfloat16" or src not in ACC_DTYPE:
        return v.cast(dtype)
    (cast_pass,) = _row_passes(v.numel(), 1, src, dtype, ACC_DTYPE[dtype], None)
    return _reshape(pass_launch(cast_pass, _launch.on_cuda())([_reshape(v, (v.numel(),))]), tuple(v.shape))




class _Plan:
    """A broadcast of one signature: x into the forward launch (no reshape: its kernel reads x's elements in
    order and writes the output's, but for Vars of more than ``CODE_MAX_RANK`` dims). Its backward: on the CPU
    the launch's grad source (one pass over dout); on the GPU, when a backward may follow, the launch is
    recorded for autograd (``_launch.taped``) with the reduction passes as its backward, made on the first
    backward."""

    __slots__ = ("launch", "need_grad", "grad_key", "_passes", "flat_in", "out_shape")

    def __init__(self, launch, need_grad, grad_key):
        self.launch = launch
        self.need_grad, self.grad_key, self._passes = need_grad, grad_key, None
        x_shape, out_shape = grad_key[0], grad_key[1]
        self.flat_in = (math.prod(x_shape),) if len(x_shape) > CODE_MAX_RANK else None
        self.out_shape = out_shape if len(out_shape) > CODE_MAX_RANK else None

    def forward(self, inputs):
        x = inputs[0] if self.flat_in is None else _reshape(inputs[0], self.flat_in)
        y = self.launch([x])
        return y if self.out_shape is None else _reshape(y, self.out_shape)

    def grad(self, dy):
        x_shape, out_shape, dtype, cuda = self.grad_key
        if self._passes is None:
            cfg = select_grad_config(x_shape, out_shape, dtype, str(dy.dtype))
            self._passes = [(pass_launch(p, cuda), p.kind == "row_split") for p in cfg.passes]
        v = _reshape(dy, (dy.numel(),))
        if not self._passes:
            return (_reshape(cast_rounded(v, dtype), x_shape),)
        for launch, split in self._passes:
            v = launch([v])[0] if split else launch([v])
        return (_reshape(v, x_shape),)

    def __call__(self, x):
        if self.need_grad and self.grad_key[3]:  # the CPU launch carries its backward as a grad source
            return _launch.taped((x,), self.forward, self.grad)
        return self.forward((x,))


class _EmptyPlan:
    """Nothing to launch; no gradient flows to x (it has no element used)."""

    __slots__ = ("out_shape", "dtype")

    def __init__(self, out_shape, dtype):
        self.out_shape, self.dtype = out_shape, dtype

    def __call__(self, x):
        return jt.zeros(self.out_shape, self.dtype)


def _plan(x_shape: Shape, dtype: str, out_shape: Shape, need_grad: bool, cuda: bool):
    if math.prod(out_shape) == 0:
        return _EmptyPlan(out_shape, dtype)
    cfg = select_config(x_shape, out_shape, dtype)
    need_grad = need_grad and dtype in ACC_DTYPE
    plan = _Plan(forward_launch(cfg, dtype, cuda, out_shape, need_grad), need_grad, (x_shape, out_shape, dtype, cuda))
    if plan.flat_in is None and plan.out_shape is None and not (need_grad and cuda):
        return plan.launch.bind(1)  # the call is the launch alone (its backward, if any, a grad source)
    return plan


_PLANS_TO, _PLANS_AS = _launch.PlanCache("broadcast_to"), _launch.PlanCache("expand_as")


# ==============================================================================================================
# Autograd, functional API, Module
# ==============================================================================================================
def _plan_of(x, target_shape: Shape, other_name: str, need_grad: bool):
    """The plan of broadcasting ``x`` to ``target_shape``, after checking it."""
    x_shape = tuple(x.shape)
    out_shape = broadcast_shape(x_shape, target_shape, "x", other_name)
    return _plan(x_shape, str(x.dtype), out_shape, need_grad, _launch.on_cuda())


def _broadcast_to_plan(x, shape, need_grad: bool):
    target_shape = _as_shape(shape, "shape")
    check_rank(len(target_shape), "shape")
    return _plan_of(x, target_shape, "shape", need_grad)


def _expand_as_plan(x, other, need_grad: bool):
    return _plan_of(x, tuple(other.shape), "other's shape", need_grad)


_open_to = opening1(_PLANS_TO, _broadcast_to_plan)
_open_as = opening_shaped(_PLANS_AS, _expand_as_plan)


def broadcast_to(x, shape):
    """``x`` broadcast to ``shape`` (NumPy rules; leading dims may be added; ``-1`` keeps x's size there).

    Returns a new, materialized Var. Differentiable for float dtypes: the gradient is the output gradient
    summed over the broadcast dims (deterministic). Raises TypeError for a non-Var ``x`` or a non-int
    ``shape`` entry, ValueError (naming both shapes) when x cannot be broadcast to ``shape``.
    """
    return _open_to(x, shape)


def expand_as(x, other):
    """``x`` broadcast to ``other``'s shape (see ``broadcast_to``); ``other`` only lends its shape."""
    return _open_as(x, other)


class ExpandAs(jt.Module):
    """Layer of :func:`expand_as`: ``ExpandAs()(x, other) == expand_as(x, other)``."""

    def execute(self, x, other):
        """``x`` broadcast to ``other``'s shape (NumPy rules), materialized; ``other`` only lends its shape."""
        return expand_as(x, other)

    forward = execute

    def extra_repr(self) -> str:
        return ""
