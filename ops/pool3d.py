"""max_pool3d: MaxPool3D forward and deterministic backward with shape-dispatched kernels.

Semantics are PyTorch's ``torch.nn.functional.max_pool3d``: input (N, C, D, H, W) or (C, D, H, W); int or
3-tuple parameters; ``stride=None`` means ``kernel_size``; implicit -inf padding of at most half the kernel;
PyTorch's output size rule with ``ceil_mode`` (a last window starting in the right padding is dropped). In each
window the elements are taken in (d, h, w) order and a larger value or a NaN takes over: ties keep the first
maximum, a window holding a NaN yields NaN (its index: the last NaN, as PyTorch). ``indices`` are int32 flat
positions ``(d * H + h) * W + w`` in each (n, c) plane.

Layers (top to bottom):

* shape algebra, pure Python: :func:`normalize_params`, :func:`pool_output_size`, :func:`output_shape`,
  :func:`padding_free`, :func:`windows_disjoint`;
* dispatch: :func:`select_config` -> :class:`KernelConfig` (variant and its compile-time constants);
* sources: :func:`menus` (the instantiations one translation unit holds), :func:`cuda_header` (the kernels of
  ``cuda_snippets/pool3d.cuh`` and the generated menus), :func:`cuda_forward_src` / :func:`cuda_backward_src`
  (one line each), the CPU path ``cuda_snippets/pool3d_cpu.h`` (separable passes on integer keys, the backward
  from the saved indices in output order);
* :func:`plan`: one per call signature (kept by ``ops._launch.PlanCache``): a ``jt.code`` whose grad source is the
  backward, so a training step runs no Python in the backward;
* the functional API :func:`max_pool3d` and the Module :class:`MaxPool3d`.

Variants. Forward (every variant computes the values; with ``mode`` 3 it also writes the indices):

============== ==============================================================================================
fwd_k2s2_vec   kernel = stride = 2, dilation 1, no padding and no partial window, W % VEC == 0: one thread
               reads the four input rows of VEC/2 adjacent outputs as VEC-wide (up to 16-byte) loads.
fwd_flat       one output per thread, OPT outputs per thread; window loops unrolled where the window is
               one of ``FLAT_WINDOWS``, bounds checks compiled out when padding-free; with no
               padding and dilation 1 (ceil_mode's partial last windows), ``clamp``: an index past the end
               reads the dim's last element, which the window holds already, so every load is unconditional.
fwd_warp       one warp per output for big windows (>= ``WARP_MIN_WINDOW`` elements) with few outputs or
               h = w = 1 outputs: lanes read the window coalesced and merge by shuffles.
fwd_rows       values only (no indices wanted), dilation 1 along W, W stride <= ``ROWS_MAX_SW``, W kernel <=
               ``ROWS_MAX_KW``, W % VEC == 0, W padding <= VEC: one thread makes VEC adjacent outputs of a row; it
               loads each window row's span once as VEC-wide chunks, keeps the column-wise maximum over the
               kd * kh rows in registers (separable max, NaN-propagating), then reduces KW columns per output.
fwd_cpu        the CPU path: each plane's maximum in three separable passes (D, H, W) over integer keys of the
               bits (NaN the largest key), positions carried and compared where indices are written.
============== ==============================================================================================

Backward (dx; never atomics, bit-identical across runs):

=================== =========================================================================================
bwd_gather          every other window layout: every input element sums, in a fixed order, dy of the windows that
                    can hold it and whose saved argmax is this element (the forward saves the int32 indices
                    when a backward may follow). A thread takes a run of ``vec`` adjacent elements of a row (16
                    bytes) and reads each window's index once for the run; window sizes, strides and dilations
                    are compile-time where the window is in GATHER_WINDOWS (cuda_snippets/pool3d_gather.cuh),
                    and GATHER_LOADS says how such a window loads its candidates (a REACH window: a run of
                    each row of a block of GATHER_REACH_ROWS (D, H) rows a thread). Moves dy + indices + dx.
bwd_disjoint        disjoint windows that hold at most half of the input (k2s3): a thread per 32 bytes of dx,
                    each element dy of the one window that can hold it where that window's saved argmax is the
                    element, else +0 (dy's bits, as the CPU path's copy). Moves dx once, coalesced, + the dy and
                    indices of the windows.
bwd_runs            overlapping windows, 5+ windows along W per element (k8s1, k5s1): per output row
                    and W class, one dy sum for each run of consecutive windows sharing an argmax, kept at the argmax's
                    column; then each element sums, over the k_d * k_h rows that can hold it, the kept sums that
                    name it. Moves dy + indices + two rows of W per output row + dx.
bwd_gather_cpu      the CPU path from the saved indices: dx zeroed, then dy of each output added at its index in
                    output order (each element sums its windows in the gather's order: the same dx bit for bit);
                    a copy where windows are disjoint.
=================== =========================================================================================

Compiles. A translation unit holds a menu: every instantiation the dispatcher can pick for one dtype, index type
and direction (forward values, forward values and indices, gather backward); the entry runs through ``data``
with the sizes and pooling parameters, so every layer of a model shares one compile per dtype and direction.
Windows outside the menus' compile-time ones take the runtime-window instantiations. The CPU source takes the
window from one ``data`` entry (:func:`cpu_geometry_data`): one CPU compile per dtype and direction.
"""
from __future__ import annotations

import functools as _functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from . import _codegen
from . import _launch
from ._args import as_flag, as_index, as_index_sequence, is_sequence
from ._calls import check_var, opening1, reshape as _reshape
from ._jittor import jt

__all__ = ["max_pool3d", "MaxPool3d", "PoolParams", "KernelConfig", "normalize_params", "pool_output_size",
           "output_shape", "padding_free", "windows_disjoint",
           "select_config", "menus", "menu_index",
           "cuda_header", "cuda_forward_src", "cuda_backward_src", "cpu_header", "cpu_forward_src",
           "cpu_backward_src", "cpu_geometry_data", "plan", "VARIANTS"]

Triple = Tuple[int, int, int]

# ---- tuning constants -------------------------------------------------------------------------------------

# Windows unrolled at compile time in fwd_flat (cubic 2 and 3, the video layers' (1,3,3), (1,2,2), (2,3,3), and
# k8); others take the runtime loop: k3s2p1 (8,64,16,56,56) f32 45.7% of copy unrolled against 33.7 looped.
FLAT_WINDOWS = ((2, 2, 2), (3, 3, 3), (1, 3, 3), (1, 2, 2), (2, 3, 3), (8, 8, 8))
GENERIC_WINDOW = (0, 0, 0)
# Threads per block for every kernel: 128, 256 and 512 were level (k2s2 (8,32,32,64,64) 96.5 / 96.5 / 96.2%).
BLOCK = 256
# Outputs per thread of fwd_flat: 1 beat 2 and 4 (k2s2 ceil (8,32,31,63,63) f16 66.5% of copy against 53.2).
FLAT_OPT = 1
# Warp layout: a window of at least one element per lane ...
WARP_MIN_WINDOW = 32
# ... and fewer outputs than this (or h = w = 1 outputs): k8s8 f32, 8192 outputs 0.0105 ms warp against 0.0196
# flat, 32768 outputs 0.0418 against 0.0375.
WARP_MAX_OUTPUTS = 1 << 14
# Windows the warp kernels take at compile time (k8 and the h = w = 1 layers' (2, 8, 8)); others at run time.
WARP_WINDOWS = ((8, 8, 8), (2, 8, 8))
# k2s2 vector loads: at most 16 bytes, the widest single access.
MAX_VEC_BYTES = 16
# k2s2 items per thread, 1 of 16-byte loads or 2 of narrower: (16,64,16,56,56) bf16 94.5% of copy against 82.9
# at 2 and 4.
K2_OPT_WIDE, K2_OPT_NARROW = 1, 2
# fwd_rows: W kernel <= 8 and W stride <= 2 keep an item's span in registers; k3s1 f32 0.018 ms against 0.054
# in fwd_flat, k3s2p1 0.050 against 0.092.
ROWS_MAX_KW, ROWS_MAX_SW = 8, 2
# The fwd_rows instantiations of every forward translation unit (W kernels, strides, paddings); others take
# fwd_flat.
ROWS_KW, ROWS_SW, ROWS_PW = (2, 3, 4, 5, 8), (1, 2), (0, 1)
# Gather backward: a thread takes a 16-byte run of a row and reads each window's index once for it: k3s2p1
# 0.098 ms against 0.396 with one element per thread.
GATHER_RUN_BYTES = 16
# 32-byte runs for 4- and 8-byte elements where an element lies in at most 8 windows and W is whole runs: k4s4
# 0.0356 ms against 0.0558; partial runs (W = 63: k2s2 ceil 0.100 against 0.0728) and more windows (k8s1 0.182
# against 0.115) lost.
GATHER_WIDE_RUN_BYTES, GATHER_WIDE_MAX_WINDOWS = 32, 8
# Disjoint windows that hold at most this share of the input take bwd_disjoint instead of the gather (k2s3
# (8,32,32,63,63) f32, 30% held: the gather 0.108 ms on an H100, the memset-and-scatter it replaces 0.0747 on an
# H200 against PyTorch's 0.0709; design.md).
DISJOINT_MAX_COVERED = 0.5
# bwd_disjoint's bytes of dx per thread: k2s3 f32 on an H200, kernel ms 0.0896 (8 bytes), 0.0731 (16), 0.0651 (32).
DISJOINT_RUN_BYTES = 32
# Overlapping windows with at least this many windows along W per element take the two passes of bwd_runs
# (per output row, one dy sum per run of windows sharing an argmax; then k_d * k_h reads per element). H100 kernel
# ms, runs against gather: k8s1 (2,16,32,32,32) f32 0.062 vs 0.111, k3s1 (4,32,32,32,32) 0.093 vs 0.059, k3s1d2
# 0.116 vs 0.080; 5 is where the two per-element costs cross, interpolated in log k (design.md).
RUNS_MIN_W_WINDOWS = 5
# bwd_runs keeps a run's argmax as its place in the row's windows, kz * kh + ky, in a byte (POOL3D_RUNS_NO_HEAD:
# no run): pass 2 of k8s1 reads 64 bytes of heads per element instead of 256.
RUNS_NO_HEAD = 255
# Windows (kernel, stride, dilation) the gather takes at compile time; any other layer runs the same kernel with
# the window at run time (Pool3dWinR). Staging the overlapping windows' indices and dy in shared memory per
# block instead was 1.3-2.1x slower on an H200 (k3s1 0.084 ms against 0.057; design.md, bwd_tile). Compile-time
# against run-time window on an H200, kernel ms: k3s1 dilation 2 0.058 against 0.081, k4s4 0.026 against 0.034.
GATHER_WINDOWS = (
    ((2, 2, 2), (2, 2, 2), (1, 1, 1)), ((3, 3, 3), (1, 1, 1), (1, 1, 1)), ((3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ((2, 2, 2), (1, 1, 1), (1, 1, 1)), ((1, 3, 3), (1, 2, 2), (1, 1, 1)), ((1, 2, 2), (1, 2, 2), (1, 1, 1)),
    ((3, 3, 3), (1, 1, 1), (2, 2, 2)), ((4, 4, 4), (4, 4, 4), (1, 1, 1)),
)
# How the gather loads a compile-time window's candidates (pool3d_gather.cuh): every index and dy of a row before
# any test (ROW), with the rows unrolled too (ALL), ALL comparing each window with the elements it reaches only
# (REACH: stride 1), or each dy only where its index is one of the run's elements (any window not listed). H200
# kernel ms, on demand / ROW / ALL / REACH: k3s1 f32 0.0570 / 0.0413 / 0.0421 / 0.0364 (f16 0.0537 / 0.0443 /
# 0.0437 / 0.0401, f64 0.130 / 0.066 / 0.071 / 0.063), k2s1 0.0317 / 0.0220 / 0.0215 / 0.0191, k3s2p1 f32 0.0818 /
# 0.0592 / 0.0696, k2s2 f32 0.0549 / 0.0477 / 0.0469 (f16 0.0678 / 0.0626 / 0.0545), (1,3,3)s(1,2,2) bf16 0.0383 /
# 0.0311 / 0.0290, (1,2,2)s(1,2,2) 0.0309 / 0.0286 / 0.0289; k3s1 dilation 2 0.0581 on demand, REACH 0.0655 in runs
# of 4 and 0.0513 in runs of 8 (GATHER_WIDE_WINDOWS); k4s4 0.0262 / 0.0270 / 0.0279 stays on demand.
GATHER_LOADS = {
    ((3, 3, 3), (1, 1, 1), (1, 1, 1)): "POOL3D_LOADS_REACH",
    ((2, 2, 2), (1, 1, 1), (1, 1, 1)): "POOL3D_LOADS_REACH",
    ((3, 3, 3), (1, 1, 1), (2, 2, 2)): "POOL3D_LOADS_REACH",
    ((3, 3, 3), (2, 2, 2), (1, 1, 1)): "POOL3D_LOADS_ROW",
    ((1, 2, 2), (1, 2, 2), (1, 1, 1)): "POOL3D_LOADS_ROW",
    ((2, 2, 2), (2, 2, 2), (1, 1, 1)): "POOL3D_LOADS_ALL",
    ((1, 3, 3), (1, 2, 2), (1, 1, 1)): "POOL3D_LOADS_ALL",
}
# Windows whose 4-byte elements take 32-byte runs though an element lies in more than GATHER_WIDE_MAX_WINDOWS of
# them, and the (window, element size, run) that load on demand though the window has a GATHER_LOADS form: a dilated
# row's REACH loads RUN + (kw - 1) * dw windows. k3s1 dilation 2, kernel ms, on demand / REACH: f32 runs of 4 0.0580
# / 0.0655, runs of 8 - / 0.0513; f16 runs of 8 0.0669 / 0.0502; f64 runs of 2 0.126 / 0.080, of 4 - / 0.098.
GATHER_WIDE_WINDOWS = (((3, 3, 3), (1, 1, 1), (2, 2, 2)),)
# A REACH gather thread takes a run of each row of a block of (D, H) input rows (pool3d_gather_block_reach: rows
# id .. id + 3 * dd share kd - 1 of their candidate output rows along D, so a block loads (kd + 3) * kh rows where
# four single rows load 4 * kd * kh). H200 kernel ms, blocks 1x1 / 1x2 / 2x1 / 4x1 / 2x2 / 8x1 / 4x2
# (scores/runs/h200-2026-11-29f-gather-blocks.log): k3s1 (4,32,32,32,32) f32 0.0369 / 0.0448 / 0.0327 / 0.0286 /
# 0.0339 / 0.0318 / 0.0325, f16 0.0396 / 0.0457 / 0.0400 / 0.0337 / 0.0626 / 0.0540 / 0.0532, k3s1d2 f32 0.0512 /
# 0.0458 / 0.0409 / 0.0353 / 0.0496 / 0.0557 / 0.0494; 4x1 is the fastest or within 10% of it on all 10 layers.
GATHER_REACH_ROWS = (4, 1)
GATHER_ON_DEMAND = ((((3, 3, 3), (1, 1, 1), (2, 2, 2)), 4, 4),)
# The backward gathers from the int32 indices the forward saves, for every layout: recomputing each argmax from
# x instead (no indices kept) was 1.1-3.4x slower (k4s4 (4,32,32,64,64) f32 0.108 ms against 0.032).
VARIANTS = {
    "fwd": ("fwd_k2s2_vec", "fwd_flat", "fwd_warp", "fwd_rows", "fwd_cpu"),
    "bwd": ("bwd_gather", "bwd_disjoint", "bwd_runs", "bwd_gather_cpu"),
}
# Forward modes (bit 1: values, bit 2: indices), as the kernels' MODE template argument.
MODE_VALUES, MODE_BOTH = 1, 3
FLOAT_DTYPES = _codegen.FLOAT_DTYPES

# ---- shape algebra ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolParams:
    """Normalized pooling parameters, each a (d, h, w) triple."""

    kernel: Triple
    stride: Triple
    padding: Triple
    dilation: Triple
    ceil_mode: bool = False

    @property
    def volume(self) -> int:
        return self.kernel[0] * self.kernel[1] * self.kernel[2]

    def data(self) -> dict:
        """The pooling parameters as jt.code ``data`` (runtime kernel arguments)."""
        out = {}
        for key, values in (("k", self.kernel), ("s", self.stride), ("p", self.padding), ("d", self.dilation)):
            for axis, v in zip("dhw", values):
                out[key + axis] = v
        return out


def _triple(value, name: str) -> Triple:
    """An int, or a sequence (tuple, list, range, 1-D NumPy array) of 1 or 3 ints (PyTorch's rule), as a triple;
    TypeError/ValueError naming ``name`` otherwise. Ints in any form ``_args.as_index`` takes."""
    if is_sequence(value):
        ints = as_index_sequence(value, name, positions=False)
        if len(ints) not in (1, 3):
            raise ValueError(f"{name} must be an int or a tuple of 1 or 3 ints (d, h, w), got {len(ints)} values "
                             f"{ints}")
        return ints * 3 if len(ints) == 1 else ints
    if isinstance(value, jt.Var) or hasattr(value, "__index__"):
        return (as_index(value, name),) * 3
    raise TypeError(f"{name} must be an int or a tuple of 1 or 3 ints, got {type(value).__name__} ({value!r})")


def _default_stride(stride) -> bool:
    """None, or an empty sequence (PyTorch's functional default is ``[]``): the stride is the kernel size."""
    return stride is None or (is_sequence(stride) and hasattr(stride, "__len__") and len(stride) == 0)


def normalize_params(kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False) -> PoolParams:
    """Validated :class:`PoolParams`; errors name the argument (PyTorch's rules). ``stride`` None (or an empty
    sequence, as PyTorch) means ``kernel_size``; ``dilation`` None means 1 (jittor's default)."""
    kernel = _triple(kernel_size, "kernel_size")
    stride = kernel if _default_stride(stride) else _triple(stride, "stride")
    padding = _triple(padding, "padding")
    dilation = (1, 1, 1) if dilation is None else _triple(dilation, "dilation")
    for name, values, low in (("kernel_size", kernel, 1), ("stride", stride, 1), ("dilation", dilation, 1),
                              ("padding", padding, 0)):
        if min(values) < low:
            what = "positive" if low == 1 else "non-negative"
            raise ValueError(f"{name} must be {what}, got {values}")
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise ValueError(f"padding should be at most half of kernel_size in every dim, got padding={padding} "
                         f"for kernel_size={kernel}")
    return PoolParams(kernel, stride, padding, dilation, as_flag(ceil_mode, "ceil_mode"))


def pool_output_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size along one dim (may be < 1 for an input smaller than the window)."""
    span = size + 2 * p - d * (k - 1) - 1
    if span < 0:
        return 0
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window would start in the right padding
        out -= 1
    return out


def output_shape(spatial: Sequence[int], params: PoolParams) -> Triple:
    """(Do, Ho, Wo); ValueError naming kernel_size when an output size would be below 1."""
    out = tuple(pool_output_size(n, k, s, p, d, params.ceil_mode) for n, k, s, p, d in
                zip(spatial, params.kernel, params.stride, params.padding, params.dilation))
    if min(out) < 1:
        raise ValueError(f"output size would be {out} (< 1): input spatial size {tuple(spatial)} is smaller than "
                         f"the dilated kernel_size {params.kernel} (dilation {params.dilation}, padding "
                         f"{params.padding})")
    return out


def padding_free(spatial: Sequence[int], out: Sequence[int], params: PoolParams) -> bool:
    """No padding and every window lies inside the input: the kernels need no bounds checks."""
    return all(p == 0 and (o - 1) * s + d * (k - 1) <= n - 1 for n, o, k, s, p, d in
               zip(spatial, out, params.kernel, params.stride, params.padding, params.dilation))


def clamp_exact(params: PoolParams) -> bool:
    """No padding and dilation 1: a window index past the input's end (ceil_mode's last windows) can read the
    dim's last element instead, which the window already holds, without changing its max or argmax."""
    return all(p == 0 and d == 1 for p, d in zip(params.padding, params.dilation))


def windows_disjoint(params: PoolParams) -> bool:
    """No input element lies in two windows: stride >= dilation * (kernel - 1) + 1 in every dim."""
    return all(s >= d * (k - 1) + 1 for k, s, d in zip(params.kernel, params.stride, params.dilation))


def covered_fraction(spatial: Triple, out: Triple, params: PoolParams) -> float:
    """The share of a plane's elements that some window holds, where windows are disjoint (padding and
    dilation's gaps count as held: an upper bound)."""
    return math.prod(min(1.0, o * (d * (k - 1) + 1) / n) if n else 1.0
                     for n, o, k, d in zip(spatial, out, params.kernel, params.dilation))


def windows_per_element(kernel: Triple, stride: Triple) -> int:
    """How many windows one input element can lie in (dilation's gaps aside): the product of ceil(k / s)."""
    return math.prod(-(-k // s) for k, s in zip(kernel, stride))


def wide_gather_allowed(window: Tuple[Triple, Triple, Triple], itemsize: int) -> bool:
    """May the gather take 32-byte runs for ``window`` (kernel, stride, dilation)?"""
    kernel, stride, _ = window
    return itemsize >= 4 and (windows_per_element(kernel, stride) <= GATHER_WIDE_MAX_WINDOWS
                              or (itemsize == 4 and window in GATHER_WIDE_WINDOWS))


def gather_run(window: Tuple[Triple, Triple, Triple], itemsize: int, width: int) -> int:
    """Elements per thread of the gather backward (its run along a row of ``width`` elements)."""
    wide = GATHER_WIDE_RUN_BYTES // itemsize
    if wide_gather_allowed(window, itemsize) and width % wide == 0:
        return wide
    return GATHER_RUN_BYTES // itemsize


def gather_loads(window: Optional[Tuple[Triple, Triple, Triple]], itemsize: int, run: int) -> str:
    """How the gather of a compile-time ``window`` (None: the run-time window) on elements of ``itemsize`` bytes
    in runs of ``run`` elements loads its candidate windows (pool3d_gather.cuh's POOL3D_LOADS_*)."""
    if window is None or (window, itemsize, run) in GATHER_ON_DEMAND:
        return "POOL3D_LOADS_ON_DEMAND"
    return GATHER_LOADS.get(window, "POOL3D_LOADS_ON_DEMAND")


# ---- dispatch ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelConfig:
    """What one launch needs: the variant and its compile-time constants (the rest, sizes and the pooling
    parameters, reach the kernel at run time; the launcher computes its grid)."""

    variant: str
    k: Triple = GENERIC_WINDOW  # compile-time window sizes; (0, 0, 0) = runtime loop
    nopad: bool = False  # no bounds checks (padding-free)
    clamp: bool = False  # fwd_flat: indices past the input's end read its last element (see clamp_exact)
    vec: int = 1  # elements per vector load (k2s2 and rows variants), per run (gather)
    sw: int = 0  # compile-time W stride (fwd_rows), 0 otherwise
    pw: int = 0  # compile-time W padding (fwd_rows)
    window: Optional[Tuple[Triple, Triple, Triple]] = None  # bwd_gather: compile-time (kernel, stride, dilation)
    rows: Tuple[int, int] = (1, 1)  # bwd_gather: a thread takes a run of each row of a block of (D, H) input rows
    opt: int = 1  # work items per thread
    block: int = 0  # threads per block (0 on the CPU)
    index_type: str = "int"

    @property
    def name(self) -> str:
        """The variant with its specialization, e.g. ``fwd_flat/k3x3x3/nopad``."""
        parts = [self.variant]
        if any(self.k):
            parts.append("k" + "x".join(str(k) if k else "n" for k in self.k))
        if self.window is not None and not any(self.k):
            parts.append("k" + "x".join(map(str, self.window[0])))
        if self.sw:
            parts.append(f"sw{self.sw}")
        if self.vec > 1:
            parts.append(f"vec{self.vec}")
        if self.nopad:
            parts.append("nopad")
        if self.clamp:
            parts.append("clamp")
        if self.rows != (1, 1):
            parts.append("rows%dx%d" % self.rows)
        return "/".join(parts)


def _vecs(itemsize: int) -> Tuple[int, ...]:
    """Vector widths (elements) of at most MAX_VEC_BYTES, widest first, at least 2 elements."""
    return tuple(v for v in (8, 4, 2) if v * itemsize <= MAX_VEC_BYTES)


def _k2s2_vec(params: PoolParams, width: int, itemsize: int) -> int:
    """The k2s2 vector width (elements) for rows of ``width`` elements; 0 when the k2s2 path does not apply."""
    if params.kernel != (2, 2, 2) or params.stride != (2, 2, 2) or params.dilation != (1, 1, 1):
        return 0
    return next((vec for vec in _vecs(itemsize) if width % vec == 0), 0)


def _use_warp(params: PoolParams, outputs: int, out: Triple) -> bool:
    return params.volume >= WARP_MIN_WINDOW and (outputs <= WARP_MAX_OUTPUTS or out[1] * out[2] == 1)


def _rows_vec(params: PoolParams, width: int, itemsize: int) -> int:
    """The fwd_rows vector width (elements, the outputs per thread); 0 when fwd_rows does not apply.

    Needs dilation 1 along W and a W kernel, stride and padding of the menu (ROWS_KW, ROWS_SW, ROWS_PW), and one
    of the two widest vector widths dividing W.
    """
    if (params.dilation[2] != 1 or params.kernel[2] not in ROWS_KW or params.stride[2] not in ROWS_SW
            or params.padding[2] not in ROWS_PW):
        return 0
    return next((vec for vec in _vecs(itemsize)[:2] if width % vec == 0), 0)


def _menu_window(kernel: Triple, menu: Sequence[Triple]) -> Triple:
    return kernel if kernel in menu else GENERIC_WINDOW


def windows_along_w(params) -> int:
    """How many windows an input element lies in along W (at most): kernel * gcd(stride, dilation) / stride."""
    s, d = params.stride[2], params.dilation[2]
    return -(-params.kernel[2] * math.gcd(s, d) // s)


def select_config(x_shape: Sequence[int], dtype, params: PoolParams, direction: str = "fwd",
                  on_cuda: Optional[bool] = None, indices: bool = False) -> KernelConfig:
    """The kernel for pooling a tensor of ``x_shape`` (any leading dims, then D, H, W) of ``dtype``.

    ``direction`` is "fwd" or "bwd"; ``on_cuda`` defaults to where jittor runs now; ``indices``: the forward
    must also write the argmax indices (mode 3), which rules out the values-only ``fwd_rows``. The backward
    gathers from the indices the forward saves.
    """
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    cuda = _launch.on_cuda() if on_cuda is None else on_cuda
    spatial = tuple(int(n) for n in x_shape[-3:])
    planes = math.prod(int(n) for n in x_shape[:-3])
    out = output_shape(spatial, params)
    outputs = planes * math.prod(out)
    inputs = planes * math.prod(spatial)
    itype = _codegen.index_type(max(inputs, outputs))
    nopad = padding_free(spatial, out, params)
    itemsize = _codegen.ITEMSIZE[_codegen.dtype_name(dtype)]
    if direction == "bwd":
        if not cuda:
            return KernelConfig("bwd_gather_cpu", nopad=nopad, index_type=itype)
        if windows_disjoint(params) and covered_fraction(spatial, out, params) <= DISJOINT_MAX_COVERED:
            return KernelConfig("bwd_disjoint", vec=DISJOINT_RUN_BYTES // itemsize, block=BLOCK, index_type=itype)
        if windows_along_w(params) >= RUNS_MIN_W_WINDOWS and params.kernel[0] * params.kernel[1] < RUNS_NO_HEAD:
            return KernelConfig("bwd_runs", vec=GATHER_RUN_BYTES // itemsize, block=BLOCK, index_type=itype)
        window = (params.kernel, params.stride, params.dilation)
        run = gather_run(window, itemsize, spatial[2])
        if window not in GATHER_WINDOWS:
            return KernelConfig("bwd_gather", vec=run, block=BLOCK, index_type=itype)
        return KernelConfig("bwd_gather", vec=run, block=BLOCK, index_type=itype, window=window,
                            rows=gather_rows(window, itemsize, run))
    if not cuda:
        return KernelConfig("fwd_cpu", nopad=nopad, index_type=itype)
    vec = _k2s2_vec(params, spatial[2], itemsize) if nopad else 0
    if vec:
        opt = K2_OPT_WIDE if vec * itemsize == MAX_VEC_BYTES else K2_OPT_NARROW
        return KernelConfig("fwd_k2s2_vec", k=(2, 2, 2), nopad=True, vec=vec, opt=opt, block=BLOCK,
                            index_type=itype)
    if _use_warp(params, outputs, out):
        return KernelConfig("fwd_warp", k=_menu_window(params.kernel, WARP_WINDOWS), nopad=nopad, block=BLOCK,
                            index_type=itype)
    vec = _rows_vec(params, spatial[2], itemsize) if not indices else 0
    if vec:
        return KernelConfig("fwd_rows", k=(0, 0, params.kernel[2]), nopad=nopad, vec=vec, sw=params.stride[2],
                            pw=params.padding[2], block=BLOCK, index_type=itype)
    clamp = not nopad and clamp_exact(params)
    return KernelConfig("fwd_flat", k=_menu_window(params.kernel, FLAT_WINDOWS), nopad=nopad, clamp=clamp,
                        opt=FLAT_OPT, block=BLOCK, index_type=itype)


# ---- CUDA source: the menus -------------------------------------------------------------------------------
#
# One translation unit per (dtype, index type, direction and outputs): its header includes the kernels and a
# generated menu (a host function switching over every instantiation the dispatcher can pick for that dtype);
# the source is one line calling the menu with the entry's index from `data["v"]` (forward) or `data["bv"]` (the
# backward, a jt.code grad source: jittor hands it the forward's inputs, dy, the forward's outputs and `data`).
# So a model's layers, whatever their sizes and pooling parameters, share one compile per dtype and direction.

_TF = {True: "true", False: "false"}


def _entry(cfg: KernelConfig) -> tuple:
    """The menu key of a CUDA configuration."""
    v = cfg.variant
    if v == "fwd_k2s2_vec":
        return (v, cfg.vec)
    if v == "fwd_flat":
        return (v, cfg.k, cfg.nopad, cfg.clamp)
    if v == "fwd_rows":
        return (v, cfg.vec, cfg.k[2], cfg.sw, cfg.pw, cfg.nopad)
    if v == "bwd_gather":
        return (v, cfg.window, cfg.vec, cfg.rows)
    if v in ("bwd_disjoint", "bwd_runs"):
        return (v, cfg.vec)
    return (v, cfg.k, cfg.nopad)  # fwd_warp


def _call(entry: tuple, mode: int = MODE_VALUES, itemsize: Optional[int] = None) -> str:
    """The launcher call of a menu entry (the menu function's parameters: x y yi or idx dy dx, g, planes);
    ``itemsize``: the menu's element size, which a gather entry needs (its loads depend on it)."""
    v = entry[0]
    ks = lambda k: ", ".join(map(str, k))  # noqa: E731
    if v == "fwd_k2s2_vec":
        opt = f"(({entry[1]} * sizeof(T)) == {MAX_VEC_BYTES} ? {K2_OPT_WIDE} : {K2_OPT_NARROW})"
        return f"pool3d_fwd_k2s2_launch<T, I, {entry[1]}, {mode}, {opt}, {BLOCK}>(x, y, yi, g, planes)"
    if v == "fwd_flat":
        _, k, nopad, clamp = entry
        return (f"pool3d_fwd_flat_launch<T, I, {ks(k)}, {_TF[nopad]}, {_TF[clamp]}, {mode}, {FLAT_OPT}, {BLOCK}>"
                f"(x, y, yi, g, planes)")
    if v == "fwd_warp":
        _, k, nopad = entry
        return f"pool3d_fwd_warp_launch<T, I, {ks(k)}, {_TF[nopad]}, {mode}, {BLOCK}>(x, y, yi, g, planes)"
    if v == "fwd_rows":
        _, vec, kw, sw, pw, nopad = entry
        return f"pool3d_fwd_rows_launch<T, I, {vec}, {kw}, {sw}, {pw}, {_TF[nopad]}, {BLOCK}>(x, y, yi, g, planes)"
    if v == "bwd_disjoint":
        return f"pool3d_bwd_disjoint_launch<T, I, {entry[1]}, {BLOCK}>(idx, dy, dx, g, planes)"
    if v == "bwd_runs":
        return f"pool3d_bwd_runs_launch<T, I, {entry[1]}, {BLOCK}>(idx, dy, dx, g, planes)"
    _, window, run, rows = entry  # bwd_gather
    if itemsize is None:
        raise ValueError(f"the launcher call of {entry!r} needs the menu's itemsize")
    win = "Pool3dWinR" if window is None else f"Pool3dWinC<{', '.join(ks(t) for t in window)}>"
    loads = gather_loads(window, itemsize, run)
    return (f"pool3d_bwd_gather_launch<T, I, {win}, {run}, {loads}, {rows[0]}, {rows[1]}, {BLOCK}>"
            f"(idx, dy, dx, g, planes)")


def _flags():
    return ((True, False), (False, True), (False, False))  # (nopad, clamp): unchecked, clamped, checked


def gather_rows(window: Optional[Tuple[Triple, Triple, Triple]], itemsize: int, run: int) -> Tuple[int, int]:
    """The block of (D, H) input rows a gather thread takes: GATHER_REACH_ROWS for a REACH window, else one row."""
    return GATHER_REACH_ROWS if gather_loads(window, itemsize, run) == "POOL3D_LOADS_REACH" else (1, 1)


@_functools.lru_cache(maxsize=None)
def menus(itemsize: int) -> dict:
    """The menus of one element size: forward values, forward values + indices, gather backward."""
    vecs = _vecs(itemsize)
    flat = [("fwd_flat", k, nopad, clamp) for k in FLAT_WINDOWS + (GENERIC_WINDOW,) for nopad, clamp in _flags()]
    warp = [("fwd_warp", k, nopad) for k in WARP_WINDOWS + (GENERIC_WINDOW,) for nopad in (True, False)]
    k2s2 = [("fwd_k2s2_vec", vec) for vec in vecs]
    rows = [("fwd_rows", vec, kw, sw, pw, pw == 0 and nopad) for vec in vecs[:2] for kw in ROWS_KW
            for sw in ROWS_SW for pw in ROWS_PW for nopad in ((True, False) if pw == 0 else (False,))]
    narrow, wide = GATHER_RUN_BYTES // itemsize, GATHER_WIDE_RUN_BYTES // itemsize
    gather = [("bwd_gather", w, run, gather_rows(w, itemsize, run)) for w in GATHER_WINDOWS
              for run in ((narrow, wide) if wide_gather_allowed(w, itemsize) else (narrow,))]
    gather += [("bwd_gather", None, run, (1, 1)) for run in sorted({narrow, wide if itemsize >= 4 else narrow})]
    gather += [("bwd_disjoint", DISJOINT_RUN_BYTES // itemsize), ("bwd_runs", narrow)]
    return {"values": _codegen.Menu(k2s2 + flat + warp + rows, lambda e: _call(e, MODE_VALUES)),
            "both": _codegen.Menu(k2s2 + flat + warp, lambda e: _call(e, MODE_BOTH)),
            "gather": _codegen.Menu(gather, lambda e: _call(e, itemsize=itemsize))}


_MENU_HEADS = {
    "values": "template <typename T, typename I>\n"
              "void pool3d_fwd_values_menu(int v, const T* x, T* y, int* yi, const Pool3dGeom& g, long long planes)",
    "both": "template <typename T, typename I>\n"
            "void pool3d_fwd_both_menu(int v, const T* x, T* y, int* yi, const Pool3dGeom& g, long long planes)",
    "gather": "template <typename T, typename I>\n"
              "void pool3d_bwd_gather_menu(int v, const int* idx, const T* dy, T* dx, const Pool3dGeom& g, "
              "long long planes)",
}


@_functools.lru_cache(maxsize=None)
def cuda_header(itemsize: int) -> str:
    """``cuda_header`` of every pool3d launch of one element size: the kernels and the generated menus."""
    text = "// ops: max_pool3d menus (generated by ops/pool3d.py)\n#pragma once\n" + "\n".join(
        menu.render(_MENU_HEADS[name], f"max_pool3d {name}") for name, menu in menus(itemsize).items())
    return _codegen.include(("common", "pool3d", "pool3d_gather"),
                            (_codegen.generated(f"pool3d_menus_{itemsize}", text),))


# Geometry: D, H, W from x (in0, 5-D), Do, Ho, Wo from y (the forward's out0, or dy: in1 of a grad source).
_GEOM = "pool3d_geom(in0_shape2, in0_shape3, in0_shape4, {o}_shape2, {o}_shape3, {o}_shape4, data)"
_PLANES = "(long long)in0_shape0 * in0_shape1"
_CUDA_FWD = {
    MODE_VALUES: "pool3d_fwd_values_menu<in0_type, {I}>((int)data[\"v\"], in0_p, out0_p, (int*)0, {G}, {P});",
    MODE_BOTH: "pool3d_fwd_both_menu<in0_type, {I}>((int)data[\"v\"], in0_p, out0_p, out1_p, {G}, {P});",
}
# grad sources: in0 = x, in1 = dy, in2 = y, in3 = the indices (when the forward wrote them)
_CUDA_BWD = "pool3d_bwd_gather_menu<in0_type, {I}>((int)data[\"bv\"], (const int*)in3_p, in1_p, out0_p, {G}, {P});"


def cuda_forward_src(index_type: str, mode: int) -> str:
    return _CUDA_FWD[mode].format(I=index_type, G=_GEOM.format(o="out0"), P=_PLANES)


def cuda_backward_src(index_type: str) -> str:
    return _CUDA_BWD.format(I=index_type, G=_GEOM.format(o="in1"), P=_PLANES)


def menu_index(cfg: KernelConfig, dtype, mode: int = MODE_VALUES) -> int:
    """The index of a CUDA configuration in its translation unit's menu (``data["v"]`` / ``data["bv"]``)."""
    itemsize = _codegen.ITEMSIZE[_codegen.dtype_name(dtype)]
    if cfg.variant in ("bwd_gather", "bwd_disjoint", "bwd_runs"):
        name = "gather"
    else:
        name = "values" if mode == MODE_VALUES else "both"
    return menus(itemsize)[name].index(_entry(cfg))


# ---- CPU source -------------------------------------------------------------------------------------------

_CPU_GEOM = "pool3d_cpu::geom(in0_shape2, in0_shape3, in0_shape4, {o}_shape2, {o}_shape3, {o}_shape4, data)"
_CPU_FWD = {MODE_VALUES: "pool3d_cpu::forward<in0_type, 1>(in0_p, out0_p, (int*)0, {P}, {G});",
            MODE_BOTH: "pool3d_cpu::forward<in0_type, 3>(in0_p, out0_p, out1_p, {P}, {G});"}
# grad sources: in0 = x, in1 = dy, in2 = y, in3 = the indices (when the forward wrote them); the gather needs no
# window, only the plane sizes
_CPU_PLANE_IN, _CPU_PLANE_OUT = "(long long)in0_shape2 * in0_shape3 * in0_shape4", "(long long)in1_shape2 * " \
    "in1_shape3 * in1_shape4"
_CPU_BWD = "pool3d_cpu::backward_indices<in0_type, {ADD}>((const int*)in3_p, in1_p, out0_p, {P}, {PI}, {PO});"
# A CPU kernel reads its window from data["g"]: the 12 parameters as 4-bit fields (each lookup of jittor's
# `data` map builds and hashes a string key, ~20 ns: 12 lookups were 0.25 us, the whole of a tiny pooling), or,
# when a parameter is 16 or more, -1 and four entries of three 17-bit fields.
_CPU_FIELD_BITS, _CPU_WIDE_BITS = 4, 17


def cpu_geometry_data(params: PoolParams) -> dict:
    """The ``data`` of a CPU launch: the window packed as ``pool3d_cpu::geom`` unpacks it."""
    groups = (params.kernel, params.stride, params.padding, params.dilation)
    values = [v for group in groups for v in group]
    if max(values) < 1 << _CPU_FIELD_BITS:
        return {"g": sum(v << (_CPU_FIELD_BITS * i) for i, v in enumerate(values))}
    if max(values) >= 1 << _CPU_WIDE_BITS:
        raise ValueError(f"max_pool3d on the CPU takes window parameters below {1 << _CPU_WIDE_BITS}, got "
                         f"{params}")
    data = {"g": -1}
    for key, group in zip(("gk", "gs", "gp", "gd"), groups):
        data[key] = sum(v << (_CPU_WIDE_BITS * i) for i, v in enumerate(group))
    return data


def cpu_header() -> str:
    return _codegen.cpu_include("pool3d_cpu.h")


def cpu_forward_src(mode: int) -> str:
    return _CPU_FWD[mode].format(P=_PLANES, G=_CPU_GEOM.format(o="out0"))


def cpu_backward_src(params: PoolParams) -> str:
    """The CPU backward from the saved indices: a copy where windows are disjoint, a sum where they overlap."""
    return _CPU_BWD.format(ADD=_TF[not windows_disjoint(params)], P=_PLANES, PI=_CPU_PLANE_IN, PO=_CPU_PLANE_OUT)


# ---- plans: one per call signature ------------------------------------------------------------------------


class _Plan:
    """A call of a given signature: ``x`` (reshaped to 5-D when it is 4-D) into one ``jt.code`` whose grad
    source is the backward, then the values (and the indices, when returned) in the caller's rank."""

    __slots__ = ("launch", "in_shape", "out_shape", "multi", "indices")

    def __init__(self, launch, in_shape, out_shape, indices):
        self.launch, self.in_shape, self.out_shape, self.indices = launch, in_shape, out_shape, indices
        self.multi = not launch.single  # the op writes the indices too (returned, or for the backward)

    def __call__(self, x):
        if self.in_shape is not None:
            x = _reshape(x, self.in_shape)
        out = self.launch([x])
        if self.multi:
            if not self.indices:
                out = out[0]
            elif self.out_shape is None:
                return out[0], out[1]
            else:
                return _reshape(out[0], self.out_shape), _reshape(out[1], self.out_shape)
        return out if self.out_shape is None else _reshape(out, self.out_shape)


class _EmptyPlan:
    """An empty batch: nothing to pool."""

    __slots__ = ("out_shape", "dtype", "indices")

    def __init__(self, out_shape, dtype, indices):
        self.out_shape, self.dtype, self.indices = out_shape, dtype, indices

    def __call__(self, x):
        values = jt.zeros(self.out_shape, dtype=self.dtype)
        return (values, jt.zeros(self.out_shape, dtype="int32")) if self.indices else values


def plan(x_shape: Tuple[int, ...], dtype: str, params: PoolParams, return_indices: bool, need_grad: bool,
         cuda: bool):
    """The plan of ``max_pool3d`` for an input of ``x_shape`` (validated) and ``dtype``.

    The forward writes the indices when they are returned or a backward may follow (it gathers from them). The
    backward is the forward op's grad source (no Python runs in it).
    """
    lead, spatial = x_shape[:-3], x_shape[-3:]
    out_shape = lead + output_shape(spatial, params)
    if math.prod(lead) == 0:
        return _EmptyPlan(out_shape, dtype, return_indices)
    shape5 = x_shape if len(x_shape) == 5 else (1,) + x_shape
    out5 = shape5[:2] + out_shape[-3:]
    with_indices = bool(return_indices or need_grad)
    mode = MODE_BOTH if with_indices else MODE_VALUES
    fwd = select_config(shape5, dtype, params, "fwd", on_cuda=cuda, indices=with_indices)
    data = params.data() if cuda else cpu_geometry_data(params)
    grad = None
    if need_grad:
        bwd = select_config(shape5, dtype, params, "bwd", on_cuda=cuda)
        if cuda:
            data["bv"] = menu_index(bwd, dtype)
            grad = [cuda_backward_src(bwd.index_type)]
        else:
            grad = [cpu_backward_src(params)]
    if cuda:
        data["v"] = menu_index(fwd, dtype, mode)
        src, header = cuda_forward_src(fwd.index_type, mode), cuda_header(_codegen.ITEMSIZE[dtype])
    else:
        src, header = cpu_forward_src(mode), cpu_header()
    shapes, dtypes = ([out5, out5], [dtype, "int32"]) if with_indices else (out5, dtype)
    launch = _launch.Launch(shapes, dtypes, cuda=cuda, src=src, header=header, grad_srcs=grad, data=data)
    if len(x_shape) == 5 and not return_indices:  # the call is the launch alone: the plan is the bound launch
        return launch.bind(1, first_output=True)
    in_shape = None if len(x_shape) == 5 else shape5
    return _Plan(launch, in_shape, None if len(x_shape) == 5 else out_shape, bool(return_indices))


_PLANS = _launch.PlanCache("max_pool3d")


# ---- functional API and Module ----------------------------------------------------------------------------


def _check_input(x) -> None:
    check_var(x, "x")
    if x.ndim not in (4, 5):
        raise ValueError(f"x must be 4-D (C, D, H, W) or 5-D (N, C, D, H, W), got shape {tuple(x.shape)}")
    dtype = _codegen.dtype_name(x)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"x must be a float tensor ({', '.join(FLOAT_DTYPES)}), got {dtype}")
    if min(x.shape[-3:]) < 1:
        raise ValueError(f"x must have non-empty spatial dims (D, H, W), got shape {tuple(x.shape)}")
    if math.prod(x.shape[-3:]) > _codegen.INT32_LIMIT:
        raise ValueError(f"x: a (D, H, W) plane of {math.prod(x.shape[-3:])} elements exceeds 2^31 - 1 "
                         f"(indices are int32)")


def _plan_of(x, params: tuple, need_grad: bool):
    """The plan of a call, after checking its arguments."""
    _check_input(x)
    kernel_size, stride, padding, dilation, ceil_mode, return_indices = params
    params = normalize_params(kernel_size, stride, padding, dilation, ceil_mode)
    shape = tuple(int(n) for n in x.shape)
    return plan(shape, str(x.dtype), params, as_flag(return_indices, "return_indices"), need_grad,
                _launch.on_cuda())


_open = opening1(_PLANS, _plan_of)


def max_pool3d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """3-D max pooling over the last three dims of ``x`` ((N, C, D, H, W) or (C, D, H, W)), with the arguments of
    ``torch.nn.functional.max_pool3d`` in its order (``ceil_mode`` before ``return_indices``; the layer
    :class:`MaxPool3d` takes them in the layers' order).

    ``kernel_size``, ``stride``, ``padding``, ``dilation``: an int or 1 or 3 ints (d, h, w); ``stride=None``
    means ``kernel_size``, ``dilation=None`` means 1 (jittor's default); padding at most half the kernel.
    Returns the pooled Var, or ``(values, indices)`` with ``return_indices``: int32 flat positions
    ``(d * H + h) * W + w`` of each maximum in its (n, c) plane. An empty batch gives an empty result. Raises
    TypeError/ValueError naming the bad argument. Backward is deterministic (no atomics).
    """
    return _open(x, (kernel_size, stride, padding, dilation, ceil_mode, return_indices))


def _as_given(value, name: str):
    """A pooling argument as the layer keeps it: an int, or a tuple of ints (from any sequence)."""
    return as_index_sequence(value, name, positions=False) if is_sequence(value) else as_index(value, name)


class MaxPool3d(jt.Module):
    """3-D max pooling layer, a drop-in for ``torch.nn.MaxPool3d`` and ``jittor.nn.MaxPool3d``.

    ``MaxPool3d(kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False)``: the
    layers' argument order (``return_indices`` before ``ceil_mode``), the functional :func:`max_pool3d`'s
    meanings. ``stride=None`` means ``kernel_size``; jittor's defaults ``dilation=None`` and
    ``return_indices=None`` mean 1 and False. The arguments are checked here (TypeError/ValueError naming the
    argument) and kept as PyTorch keeps them: ``kernel_size``, ``stride`` (``kernel_size`` where None),
    ``padding``, ``dilation``, ``return_indices``, ``ceil_mode``.
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        params = normalize_params(kernel_size, stride, padding, dilation, ceil_mode)  # fail at construction
        self.kernel_size = _as_given(kernel_size, "kernel_size")
        self.stride = self.kernel_size if _default_stride(stride) else _as_given(stride, "stride")
        self.padding = _as_given(padding, "padding")
        self.dilation = 1 if dilation is None else _as_given(dilation, "dilation")
        self.return_indices = as_flag(return_indices, "return_indices")
        self.ceil_mode = params.ceil_mode

    def execute(self, x):
        """Pool ``x`` ((N, C, D, H, W) or (C, D, H, W)): the pooled Var, or ``(values, indices)`` when the layer
        returns indices (int32 flat positions ``(d * H + h) * W + w`` in each (n, c) plane)."""
        return max_pool3d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                          self.return_indices)

    forward = execute

    def extra_repr(self) -> str:
        text = (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")
        return text + (", return_indices=True" if self.return_indices else "")
