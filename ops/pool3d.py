"""max_pool3d: MaxPool3D forward and deterministic backward with shape-dispatched kernels.

Semantics are PyTorch's ``torch.nn.functional.max_pool3d``: input (N, C, D, H, W) or (C, D, H, W); int or
3-tuple parameters; ``stride=None`` means ``kernel_size``; implicit -inf padding of at most half the kernel;
PyTorch's output size rule with ``ceil_mode`` (a last window starting in the right padding is dropped). In each
window the elements are taken in (d, h, w) order and a larger value or a NaN takes over: ties keep the first
maximum, a window holding a NaN yields NaN (its index: the last NaN, as PyTorch). ``indices`` are int32 flat
positions ``(d * H + h) * W + w`` in each (n, c) plane.

Layers (top to bottom):

* shape algebra, pure Python: :func:`normalize_params`, :func:`pool_output_size`, :func:`output_shape`,
  :func:`padding_free`, :func:`windows_disjoint`, :func:`windows_tile`, :func:`windows_cover_exactly`;
* dispatch: :func:`select_config` -> :class:`KernelConfig` (variant, template constants, launch geometry,
  index type);
* launch: :func:`render_cuda` (the few lines of ``cuda_src`` that call a launcher of
  ``cuda_snippets/pool3d.cuh``), :data:`CPU_HEADER` (the CPU path, the same index math as loops),
  :func:`launch_forward`, :func:`launch_backward`;
* :class:`MaxPool3dFunction` (``jt.Function``, used through ``.apply``);
* the functional API :func:`max_pool3d` and the Module :class:`MaxPool3d`.

Variants. Forward (every variant computes the values; with ``mode`` 3 it also writes the indices):

============== ==============================================================================================
fwd_k2s2_vec   kernel = stride = 2, dilation 1, no padding and no partial window, W % VEC == 0: one thread
               reads the four input rows of VEC/2 adjacent outputs as VEC-wide (up to 16-byte) loads.
fwd_flat       one output per thread, OPT outputs per thread; window loops unrolled where the kernel size
               is one of ``SPECIALIZED_K`` (per dim), bounds checks compiled out when padding-free; with no
               padding and dilation 1 (ceil_mode's partial last windows), ``clamp``: an index past the end
               reads the dim's last element, which the window holds already, so every load is unconditional.
fwd_warp       one warp per output for big windows (>= ``WARP_MIN_WINDOW`` elements) with few outputs or
               h = w = 1 outputs: lanes read the window coalesced and merge by shuffles.
fwd_rows       values only (no indices wanted), dilation 1 along W, W stride <= ``ROWS_MAX_SW``, W kernel <=
               ``ROWS_MAX_KW``, W % VEC == 0, W padding <= VEC: one thread makes VEC adjacent outputs of a row; it
               loads each window row's span once as VEC-wide chunks, keeps the column-wise maximum over the
               kd * kh rows in registers (separable max, NaN-propagating), then reduces KW columns per output.
fwd_cpu        the CPU loop nest.
============== ==============================================================================================

Backward (dx; never atomics, bit-identical across runs):

=================== =========================================================================================
bwd_gather          the default for every layout (``OPS_POOL3D_BWD``): every input element sums, in a fixed
                    order, dy of the windows that can hold it and whose saved argmax is this element (the
                    forward saves the int32 indices when a backward may follow). A thread takes a run of
                    ``vec`` adjacent elements of a row (16 bytes) and reads each window's index once for the
                    run; window sizes, strides and dilations are compile-time. One code
                    (cuda_snippets/pool3d_gather.cuh) for CUDA and the CPU path. Moves dy + indices + dx.
bwd_tile_k2s2_vec   ``OPS_POOL3D_BWD=recompute`` (no indices kept between forward and backward), k2s2 windows
                    that cover the input exactly: recompute the argmax from x with the forward's vector loads,
                    write the whole window (dy at the argmax, 0 elsewhere) as vector stores.
bwd_tile_flat/warp  recompute, other tilings (kernel == stride, dilation 1, no padding; each dim's last window
                    owns up to the input's edge: ceil_mode's partial windows, bounds-checked, and floor mode's
                    remainder, zeroed by the last window): the same, one window per thread / per warp. Moves
                    x + dy + dx, the least a recompute can; 1.1-3.4x slower than the gather on the H100
                    (``BWD_SWITCH``'s note).
bwd_scatter_flat/warp  recompute, disjoint windows that are no tiling (stride > dilation * (k - 1) + 1, or
                    padding): zero dx, recompute each window's argmax from x and write dy there.
bwd_*_cpu           the same three algorithms (tile, scatter, gather) as CPU loop nests.
=================== =========================================================================================

Every value written into the CUDA source text (window sizes, padding-free flag, vector width, outputs per
thread, block size, index type, mode) changes the generated code; sizes and pooling parameters go through
the shapes and ``data``, so one compiled kernel serves every shape of a kind. The CPU source takes
everything from ``data``: one CPU compile per dtype and algorithm.
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from . import _codegen
from ._args import as_index
from ._jittor import code, has_cuda, jt

__all__ = ["max_pool3d", "MaxPool3d", "MaxPool3dFunction", "PoolParams", "KernelConfig", "normalize_params",
           "pool_output_size", "output_shape", "padding_free", "windows_disjoint", "windows_tile",
           "windows_cover_exactly", "layout_algorithm", "backward_mode", "backward_algorithm", "select_config",
           "grid_expression", "render_cuda", "render_cpu", "CPU_HEADER", "launch_forward", "launch_backward",
           "VARIANTS"]

Triple = Tuple[int, int, int]

# ---- tuning constants -------------------------------------------------------------------------------------

# Kernel sizes (per dim) whose window loops are unrolled at compile time: 2 and 3 are the common sizes, 8 the
# seed's large case, 1 the degenerate dim of non-cubic kernels such as (1, 3, 3). Unrolling removes the loop
# counters and bounds and lets the compiler issue the window's loads ahead of the compares. H100 A/B
# (2026-11-25, one process, float32 forwards with indices, % of copy, unrolled -> runtime loop): k3s2p1
# (8,64,16,56,56) 45.7 -> 33.7, k3s1 (4,32,32,64,64) 28.3 -> 17.3, k2s2 ceil (8,32,31,63,63) 81.3 -> 68.5.
# Other sizes take the runtime loop.
SPECIALIZED_K = (1, 2, 3, 8)
# Threads per block for every kernel: 8 warps. H100 A/B (2026-11-25), 256 / 128 / 512 threads: k2s2
# (8,32,32,64,64) 96.5 / 96.5 / 96.2% of copy, k3s2p1 45.7 / 45.8 / 45.3, k2s2 ceil 81.2 / 81.5 / 80.9: level.
BLOCK = 256
# Outputs per thread of the flat kernels (fwd_flat; the recompute backward's bwd_*_flat take the same, not
# measured there). Several outputs per thread (4 for windows up to 8 elements, 2 up to 27) were predicted to
# keep more loads in flight; one output per thread was faster or level on every shape measured (H100
# 2026-11-25, one process, % of copy, 4 or 2 -> 1): k2s2 odd W (8,32,32,63,63) f32 92.9 -> 97.4 with indices,
# 84.0 -> 87.9 values only; k2s2 ceil f32 81.3 -> 86.5, f16 53.2 -> 66.5; k3s2 ceil (4,32,33,33,33) 69.5 ->
# 72.5; k3s2p1 f32 45.7 -> 47.2, bf16 24.7 -> 25.3; k3s1 and k3s1 dilation 2 level. (Our reading, not
# profiled: more resident threads, each with its own window, hide latency better than one thread's windows.)
FLAT_OPT = 1
# Warp layout: a window must have at least one element per lane ...
WARP_MIN_WINDOW = 32
# ... and there must be too few outputs for the flat layout to fill the GPU (one thread per output; 132 SMs x
# 256 threads = 33792), or h = w = 1 outputs whose flat-layout neighbours read input rows far apart. H100 A/B
# (2026-11-25), k8s8 f32 with indices, warp -> flat: 1024 outputs 0.0062 -> 0.0194 ms, 8192 outputs 0.0105 ->
# 0.0196, 32768 outputs 0.0418 -> 0.0375, 131072 outputs 0.1499 -> 0.1134. The limit sits between the
# measured points.
WARP_MAX_OUTPUTS = 1 << 14
# k2s2 vector loads: at most 16 bytes, the widest single access.
MAX_VEC_BYTES = 16
# k2s2 items per thread: 1 item of 4 x 16-byte loads, or 2 items of narrower loads (8 loads of 4-8 B). H100
# A/B (2026-11-25, forwards with indices, % of copy, 2 and 4 items -> 1 and 2): (16,64,16,56,56) bf16 82.9 ->
# 94.5, f16 92.2 -> 93.6; (8,32,32,64,64) f16 88.3 -> 90.7, f32 96.6 -> 97.0; W = 62 f32 (narrow) 95.7 ->
# 95.9; 4 and 8 items lost (f16 74.4%, f32 90.8%).
K2_OPT_WIDE, K2_OPT_NARROW = 1, 2
# fwd_rows limits: the span an item loads, SW * (VEC - 1) + KW columns rounded up to whole chunks (one chunk
# more with W padding), lives in registers (at most 32 floats for half, 20 for float, 12 doubles); KW, SW and
# the W padding are template arguments (one compile per (dtype, KW, SW, padding) in use), kd and kh are runtime
# loops. Larger strides (k4s4, k8s8) already read each element once in fwd_flat / fwd_warp. Measured on the
# H100 (2026-11-23, padding-free): k8s1 fp32 0.035 ms (was 0.111 in fwd_flat), k3s1 fp32 0.018 (0.054), k5s2
# 0.011 (0.046), k2x3x3s2x1x1 0.026 (0.049); padded: k3s2p1 fp32 0.050 (0.092), bf16 0.036 (0.095),
# k1x3x3s1x2x2p0x1x1 0.032 (0.047).
ROWS_MAX_KW, ROWS_MAX_SW = 8, 2
# Gather backward: a thread takes a run of adjacent elements of an input row, 16 bytes (4 floats, 8 halves,
# 2 doubles), written as one vector where W allows; it reads each window's saved index once for the run. The
# former one-element threads spent ~250 instructions per element (k3s2p1: 0.396 ms, 0.30x PyTorch, H100
# 2026-11-23); with runs and compile-time strides (pool3d_gather.cuh) 0.098 ms, 1.19x PyTorch (predicted
# 0.05-0.07).
GATHER_RUN_BYTES = 16
# Backward algorithm, OPS_POOL3D_BWD: "gather" (default) gathers dx from the int32 indices the forward saves when
# a backward may follow, for every window layout, as PyTorch does; "recompute" keeps the forward to the values
# for disjoint windows and recomputes each argmax from x in the backward (tile / scatter kernels: 4 bytes per
# output less memory between forward and backward, at the cost of reading x again). Overlapping windows always
# gather. Measured on the H100 (2026-11-23, one process, recompute -> gather): k4s4 (4,32,32,64,64) f32 0.108 ->
# 0.032 ms (predicted 0.031), k2s3 0.117 -> 0.067 (predicted 0.062), k2s2 floor (8,32,31,63,63) 0.141 -> 0.073
# (predicted 0.069), k2s2 (8,32,32,64,64) 0.099 -> 0.073, 256 MB 0.194 -> 0.140, k2s2 f16 0.079 -> 0.072; the
# 4-8 us cases (tiny, h = w = 1) within 0.3 us either way. A training step moves less too: the forward's index
# write (4 bytes per output) costs less than the backward's read of x.
BWD_SWITCH = "OPS_POOL3D_BWD"
BWD_MODES = ("gather", "recompute")

VARIANTS = {
    "fwd": ("fwd_k2s2_vec", "fwd_flat", "fwd_warp", "fwd_rows", "fwd_cpu"),
    "bwd": ("bwd_tile_k2s2_vec", "bwd_tile_flat", "bwd_tile_warp", "bwd_scatter_flat", "bwd_scatter_warp",
            "bwd_gather", "bwd_tile_cpu", "bwd_scatter_cpu", "bwd_gather_cpu"),
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
    """An int, or a tuple/list of 1 or 3 ints (PyTorch's rule), as a triple; TypeError/ValueError naming ``name``
    otherwise. Ints in any form ``_args.as_index`` takes."""
    if isinstance(value, (tuple, list)):
        if len(value) not in (1, 3):
            raise ValueError(f"{name} must be an int or a tuple of 1 or 3 ints (d, h, w), got {len(value)} values "
                             f"{tuple(value)}")
        ints = tuple(as_index(v, name) for v in value)
        return ints * 3 if len(ints) == 1 else ints
    if isinstance(value, jt.Var) or hasattr(value, "__index__"):
        return (as_index(value, name),) * 3
    raise TypeError(f"{name} must be an int or a tuple of 1 or 3 ints, got {type(value).__name__} ({value!r})")


def normalize_params(kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False) -> PoolParams:
    """Validated :class:`PoolParams`; errors name the argument (PyTorch's rules)."""
    kernel = _triple(kernel_size, "kernel_size")
    stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
        else _triple(stride, "stride")
    padding = _triple(padding, "padding")
    dilation = _triple(dilation, "dilation")
    for name, values, low in (("kernel_size", kernel, 1), ("stride", stride, 1), ("dilation", dilation, 1),
                              ("padding", padding, 0)):
        if min(values) < low:
            what = "positive" if low == 1 else "non-negative"
            raise ValueError(f"{name} must be {what}, got {values}")
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise ValueError(f"padding should be at most half of kernel_size in every dim, got padding={padding} "
                         f"for kernel_size={kernel}")
    if not isinstance(ceil_mode, (bool, numbers.Integral)):
        raise TypeError(f"ceil_mode must be a bool, got {type(ceil_mode).__name__}")
    return PoolParams(kernel, stride, padding, dilation, bool(ceil_mode))


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


def windows_tile(params: PoolParams) -> bool:
    """The windows partition the input once each dim's last window owns up to the input's edge: kernel ==
    stride, dilation 1 and no padding. ceil_mode's partial last windows stop short of their size (PyTorch's
    rule keeps their starts inside); in floor mode the last window also owns the remainder of fewer than k
    elements that no window holds (its gradient is 0)."""
    return all((k == 1 or d == 1) and k == s and p == 0 for k, s, p, d in
               zip(params.kernel, params.stride, params.padding, params.dilation))


def windows_cover_exactly(spatial: Sequence[int], out: Sequence[int], params: PoolParams) -> bool:
    """A tiling (:func:`windows_tile`) whose windows are all whole and leave no remainder: Lo * k == L."""
    return windows_tile(params) and all(
        o * k == n for n, o, k in zip(spatial, out, params.kernel))


# ---- dispatch ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelConfig:
    """What one launch needs: the variant, its compile-time constants and its launch geometry."""

    variant: str
    k: Triple = (0, 0, 0)  # compile-time window sizes; 0 = runtime loop
    nopad: bool = False  # no bounds checks (padding-free)
    clamp: bool = False  # fwd_flat: indices past the input's end read its last element (see clamp_exact)
    vec: int = 1  # elements per vector load (k2s2 and rows variants)
    sw: int = 0  # compile-time W stride (fwd_rows), 0 otherwise
    opt: int = 1  # work items per thread
    block: int = 0  # threads per block (0 on the CPU)
    grid: int = 0  # blocks (0 on the CPU)
    index_type: str = "int"

    @property
    def name(self) -> str:
        """The variant with its specialization, e.g. ``fwd_flat/k3x3x3/nopad``."""
        parts = [self.variant]
        if any(self.k):
            parts.append("k" + "x".join(str(k) if k else "n" for k in self.k))
        if self.sw:
            parts.append(f"sw{self.sw}")
        if self.vec > 1:
            parts.append(f"vec{self.vec}")
        if self.nopad:
            parts.append("nopad")
        if self.clamp:
            parts.append("clamp")
        return "/".join(parts)


def _on_cuda() -> bool:
    return bool(jt.flags.use_cuda) and has_cuda()


def _spec_k(kernel: Triple) -> Triple:
    return tuple(k if k in SPECIALIZED_K else 0 for k in kernel)


def _k2s2_vec(params: PoolParams, width: int, itemsize: int) -> int:
    """The k2s2 vector width (elements) for rows of ``width`` elements; 0 when the k2s2 path does not apply."""
    if params.kernel != (2, 2, 2) or params.stride != (2, 2, 2) or params.dilation != (1, 1, 1):
        return 0
    for vec in (8, 4, 2):
        if vec * itemsize <= MAX_VEC_BYTES and width % vec == 0:
            return vec
    return 0


def _use_warp(params: PoolParams, outputs: int, out: Triple) -> bool:
    return params.volume >= WARP_MIN_WINDOW and (outputs <= WARP_MAX_OUTPUTS or out[1] * out[2] == 1)


def _rows_vec(params: PoolParams, width: int, itemsize: int) -> int:
    """The fwd_rows vector width (elements, the outputs per thread); 0 when fwd_rows does not apply.

    Needs dilation 1 and stride/kernel within the register limits along W, and a W padding of at most one
    vector (the chunk loaded before the first window holds it).
    """
    if params.dilation[2] != 1 or params.stride[2] > ROWS_MAX_SW or params.kernel[2] > ROWS_MAX_KW:
        return 0
    for vec in (8, 4, 2):
        if vec * itemsize <= MAX_VEC_BYTES and width % vec == 0:
            return vec if params.padding[2] <= vec else 0
    return 0


def backward_mode() -> str:
    """``OPS_POOL3D_BWD``: "gather" (default) or "recompute"."""
    mode = os.environ.get(BWD_SWITCH, "gather").strip().lower() or "gather"
    if mode not in BWD_MODES:
        raise ValueError(f"{BWD_SWITCH} must be one of {', '.join(BWD_MODES)}, got {mode!r}")
    return mode


def layout_algorithm(params: PoolParams) -> str:
    """The recompute backward the window layout allows: 'tile', 'scatter', or 'gather' where windows overlap
    (same on CPU and CUDA; the window parameters only, since tilings take any input size)."""
    if windows_tile(params):
        return "tile"
    return "scatter" if windows_disjoint(params) else "gather"


def backward_algorithm(params: PoolParams) -> str:
    """The backward's algorithm: 'gather', or :func:`layout_algorithm` under ``OPS_POOL3D_BWD=recompute``."""
    return "gather" if backward_mode() == "gather" else layout_algorithm(params)


def select_config(x_shape: Sequence[int], dtype, params: PoolParams, direction: str = "fwd",
                  on_cuda: Optional[bool] = None, indices: bool = False,
                  algorithm: Optional[str] = None) -> KernelConfig:
    """The kernel for pooling a tensor of ``x_shape`` (any leading dims, then D, H, W) of ``dtype``.

    ``direction`` is "fwd" or "bwd"; ``on_cuda`` defaults to where jittor runs now; ``indices``: the forward
    must also write the argmax indices (mode 3), which rules out the values-only ``fwd_rows``;
    ``algorithm``: the backward's, as the forward chose it (default :func:`backward_algorithm`).
    """
    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    cuda = _on_cuda() if on_cuda is None else on_cuda
    spatial = tuple(int(n) for n in x_shape[-3:])
    planes = math.prod(int(n) for n in x_shape[:-3])
    out = output_shape(spatial, params)
    outputs = planes * math.prod(out)
    inputs = planes * math.prod(spatial)
    itype = _codegen.index_type(max(inputs, outputs))
    nopad = padding_free(spatial, out, params)
    itemsize = _codegen.ITEMSIZE[_codegen.dtype_name(dtype)]
    if direction == "bwd":
        algo = algorithm or backward_algorithm(params)
        if algo not in ("gather", layout_algorithm(params)):  # the gather serves every layout, the others one
            raise ValueError(f"algorithm must be 'gather' or {layout_algorithm(params)!r} for these windows, "
                             f"got {algo!r}")
        run = max(1, GATHER_RUN_BYTES // itemsize) if algo == "gather" else 1
        if not cuda:
            return KernelConfig(f"bwd_{algo}_cpu", nopad=nopad, vec=run, index_type=itype)
        if algo == "gather":
            items = planes * spatial[0] * spatial[1] * _ceil_div(spatial[2], run)
            return KernelConfig("bwd_gather", k=params.kernel, vec=run, block=BLOCK, grid=_ceil_div(items, BLOCK),
                                index_type=itype)
        vec = _k2s2_vec(params, spatial[2], itemsize) if windows_cover_exactly(spatial, out, params) else 0
        if vec:
            opt = K2_OPT_WIDE if vec * itemsize == MAX_VEC_BYTES else K2_OPT_NARROW
            return KernelConfig("bwd_tile_k2s2_vec", k=(2, 2, 2), nopad=True, vec=vec, opt=opt, block=BLOCK,
                                grid=_ceil_div(outputs // (vec // 2), BLOCK * opt), index_type=itype)
        if _use_warp(params, outputs, out):
            return KernelConfig(f"bwd_{algo}_warp", k=_spec_k(params.kernel), nopad=nopad, block=BLOCK,
                                grid=_ceil_div(outputs, BLOCK // 32), index_type=itype)
        return KernelConfig(f"bwd_{algo}_flat", k=_spec_k(params.kernel), nopad=nopad, opt=FLAT_OPT, block=BLOCK,
                            grid=_ceil_div(outputs, BLOCK * FLAT_OPT), index_type=itype)
    if not cuda:
        return KernelConfig("fwd_cpu", nopad=nopad, index_type=itype)
    vec = _k2s2_vec(params, spatial[2], itemsize) if nopad else 0
    if vec:
        opt = K2_OPT_WIDE if vec * itemsize == MAX_VEC_BYTES else K2_OPT_NARROW
        return KernelConfig("fwd_k2s2_vec", k=(2, 2, 2), nopad=True, vec=vec, opt=opt, block=BLOCK,
                            grid=_ceil_div(outputs // (vec // 2), BLOCK * opt), index_type=itype)
    if _use_warp(params, outputs, out):
        return KernelConfig("fwd_warp", k=_spec_k(params.kernel), nopad=nopad, block=BLOCK,
                            grid=_ceil_div(outputs, BLOCK // 32), index_type=itype)
    vec = _rows_vec(params, spatial[2], itemsize) if not indices else 0
    if vec:
        items = planes * out[0] * out[1] * _ceil_div(out[2], vec)
        return KernelConfig("fwd_rows", k=(0, 0, params.kernel[2]), nopad=nopad, vec=vec, sw=params.stride[2],
                            block=BLOCK, grid=_ceil_div(items, BLOCK), index_type=itype)
    clamp = not nopad and clamp_exact(params)
    return KernelConfig("fwd_flat", k=_spec_k(params.kernel), nopad=nopad, clamp=clamp, opt=FLAT_OPT, block=BLOCK,
                        grid=_ceil_div(outputs, BLOCK * FLAT_OPT), index_type=itype)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---- CUDA source ------------------------------------------------------------------------------------------

# Geometry from the (planes, D, H, W) input and (planes, Do, Ho, Wo) output shapes plus the parameters, which
# are literals of the source (see pool3d_geom: a `data` lookup costs ~0.23 us per call on the GPU host path).
_GEOM_FWD = "pool3d_geom(in0_shape1, in0_shape2, in0_shape3, out0_shape1, out0_shape2, out0_shape3, ${PARAMS})"
_GEOM_WINDOW = "pool3d_geom(in0_shape1, in0_shape2, in0_shape3, in1_shape1, in1_shape2, in1_shape3, ${PARAMS})"
_GEOM_GATHER = "pool3d_geom(out0_shape1, out0_shape2, out0_shape3, in1_shape1, in1_shape2, in1_shape3, ${PARAMS})"
_FWD_PTRS = {MODE_VALUES: "in0_p, out0_p, (int*)0", MODE_BOTH: "in0_p, out0_p, out1_p"}

_CUDA_TEMPLATES = {
    "fwd_flat": "pool3d_fwd_flat_launch<in0_type, ${I}, ${KD}, ${KH}, ${KW}, ${NOPAD}, ${CLAMP}, ${MODE}, ${OPT}, "
                "${BLOCK}>"
                "(${PTRS}, ${GEOM}, in0_shape0, ${GRID});",
    "fwd_warp": "pool3d_fwd_warp_launch<in0_type, ${I}, ${KD}, ${KH}, ${KW}, ${NOPAD}, ${MODE}, ${BLOCK}>"
                "(${PTRS}, ${GEOM}, in0_shape0, ${GRID});",
    "fwd_rows": "pool3d_fwd_rows_launch<in0_type, ${I}, ${VEC}, ${KW}, ${SW}, ${PW}, ${NOPAD}, ${BLOCK}>"
                "(in0_p, out0_p, ${GEOM}, in0_shape0, ${GRID});",
    "fwd_k2s2_vec": "pool3d_fwd_k2s2_launch<in0_type, ${I}, ${VEC}, ${MODE}, ${OPT}, ${BLOCK}>"
                    "(${PTRS}, ${GEOM}, in0_shape0, ${GRID});",
    "bwd_flat": "pool3d_bwd_flat_launch<in0_type, ${I}, ${KD}, ${KH}, ${KW}, ${NOPAD}, ${TILE}, ${OPT}, ${BLOCK}>"
                "(in0_p, in1_p, out0_p, ${GEOM}, in0_shape0, ${GRID});",
    "bwd_warp": "pool3d_bwd_warp_launch<in0_type, ${I}, ${KD}, ${KH}, ${KW}, ${NOPAD}, ${TILE}, ${BLOCK}>"
                "(in0_p, in1_p, out0_p, ${GEOM}, in0_shape0, ${GRID});",
    "bwd_tile_k2s2_vec": "pool3d_bwd_k2s2_launch<in0_type, ${I}, ${VEC}, ${OPT}, ${BLOCK}>"
                         "(in0_p, in1_p, out0_p, ${GEOM}, in0_shape0, ${GRID});",
    "bwd_gather": "pool3d_bwd_gather_launch<in1_type, ${I}, ${WINDOW}, ${VEC}, ${BLOCK}>"
                  "(in0_p, in1_p, out0_p, ${GEOM}, out0_shape0, ${GRID});",
}


def grid_expression(cfg: KernelConfig) -> str:
    """``cfg.grid`` as an expression over the launch's tensors, for the generated source.

    It names ``INPUTS`` (elements of the unpooled tensor), ``OUTPUTS`` (of the pooled one), ``WI`` and ``WO``
    (their W); the rendered source replaces them with jittor's variables. Written so that C++ integer
    arithmetic and Python's ``eval`` (with ``/`` read as ``//``) agree, which the tests check against
    ``select_config``.
    """
    v = cfg.variant
    if v == "bwd_gather":
        return f"ops_ceil_div(INPUTS / WI * ops_ceil_div(WI, {cfg.vec}LL), {cfg.block}LL)"
    if v.endswith("k2s2_vec"):
        return f"ops_ceil_div(OUTPUTS / {cfg.vec // 2}LL, {cfg.block * cfg.opt}LL)"
    if v.endswith("_warp"):
        return f"ops_ceil_div(OUTPUTS, {cfg.block // 32}LL)"
    if v == "fwd_rows":
        return f"ops_ceil_div(OUTPUTS / WO * ops_ceil_div(WO, {cfg.vec}LL), {cfg.block}LL)"
    return f"ops_ceil_div(OUTPUTS, {cfg.block * cfg.opt}LL)"


def _grid_source(cfg: KernelConfig) -> str:
    if cfg.variant.startswith("fwd"):
        names = {"INPUTS": "in0->num", "OUTPUTS": "out0->num", "WI": "in0_shape3", "WO": "out0_shape3"}
    elif cfg.variant == "bwd_gather":
        names = {"INPUTS": "out0->num", "OUTPUTS": "in1->num", "WI": "out0_shape3", "WO": "in1_shape3"}
    else:
        names = {"INPUTS": "in0->num", "OUTPUTS": "in1->num", "WI": "in0_shape3", "WO": "in1_shape3"}
    expr = grid_expression(cfg)
    for k, name in names.items():
        expr = expr.replace(k, f"(long long){name}")
    return expr


def render_cuda(cfg: KernelConfig, params: PoolParams, mode: int = MODE_VALUES) -> str:
    """The ``cuda_src`` of one launch: a comment naming the configuration, then the launcher call.

    The configuration and the pooling parameters go into the text; shapes do not (one compile serves every
    shape of a layer), and the grid is computed from them at launch (``grid_expression``).
    """
    variant = cfg.variant
    if variant == "fwd_rows" and mode != MODE_VALUES:
        raise ValueError(f"mode: fwd_rows writes values only, got mode {mode}")
    if variant.startswith("bwd_") and variant not in _CUDA_TEMPLATES:
        key = "bwd_" + variant.rsplit("_", 1)[1]  # bwd_{tile,scatter}_{flat,warp}
    else:
        key = variant
    tile = variant.startswith("bwd_tile")
    geom = _GEOM_FWD if variant.startswith("fwd") else _GEOM_GATHER if variant == "bwd_gather" else _GEOM_WINDOW
    geom = _codegen.render(geom, PARAMS=", ".join(
        str(v) for v in params.kernel + params.stride + params.padding + params.dilation))
    window = ", ".join(str(v) for v in params.kernel + params.stride + params.dilation)
    body = _codegen.render(
        _CUDA_TEMPLATES[key], I=cfg.index_type, KD=cfg.k[0], KH=cfg.k[1], KW=cfg.k[2],
        NOPAD=str(cfg.nopad).lower(), CLAMP=str(cfg.clamp).lower(), TILE=str(tile).lower(), MODE=mode, OPT=cfg.opt,
        BLOCK=cfg.block, VEC=cfg.vec, SW=cfg.sw, PW=params.padding[2], PTRS=_FWD_PTRS.get(mode, ""), GEOM=geom,
        WINDOW=window, GRID=_grid_source(cfg))
    return f"// max_pool3d {cfg.name} mode={mode} block={cfg.block} opt={cfg.opt} index={cfg.index_type}\n{body}\n"


# ---- CPU source -------------------------------------------------------------------------------------------

# The CPU path: the CUDA kernels' index math as loop nests (flat work-item index split into plane, z, y, x;
# the same window scan and NaN rule; the same tile / scatter / gather algorithms). Compare values are float
# (double for float64); NaN tests read the bits because jittor compiles CPU code with -Ofast.
CPU_HEADER = r"""
#include <algorithm>
#include <cstdint>
#include <cstring>
namespace pool3d_cpu {
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
inline float neg_inf() { const uint32_t b = 0xff800000u; float f; std::memcpy(&f, &b, 4); return f; }
// bfloat16 rounded to nearest even like the GPU's __float2bfloat16_rn (cpu_common.h; jittor's truncates).
template <typename T> inline T from_acc(typename Acc<T>::type v) { return ops_cpu_from<T>(v); }

struct Geom {
  long long D, H, W, Do, Ho, Wo;
  int kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw;
};
template <typename Map>
inline Geom geom(long long D, long long H, long long W, long long Do, long long Ho, long long Wo, Map& data) {
  Geom g;
  g.D = D; g.H = H; g.W = W; g.Do = Do; g.Ho = Ho; g.Wo = Wo;
  g.kd = (int)data["kd"]; g.kh = (int)data["kh"]; g.kw = (int)data["kw"];
  g.sd = (int)data["sd"]; g.sh = (int)data["sh"]; g.sw = (int)data["sw"];
  g.pd = (int)data["pd"]; g.ph = (int)data["ph"]; g.pw = (int)data["pw"];
  g.dd = (int)data["dd"]; g.dh = (int)data["dh"]; g.dw = (int)data["dw"];
  return g;
}
inline void split(long long i, long long nx, long long ny, long long nz, long long& plane, long long& z,
                  long long& y, long long& x) {
  const long long q0 = i / nx, q1 = q0 / ny;
  x = i - q0 * nx; y = q0 - q1 * ny; plane = q1 / nz; z = q1 - plane * nz;
}

// The window's argmax position in the plane, -1 for a window without elements.
template <typename T>
inline long long window_argmax(const T* plane, const Geom& g, long long od, long long oh, long long ow) {
  typedef typename Acc<T>::type A;
  const long long d0 = od * g.sd - g.pd, h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
  A best = 0;
  long long pos = -1;
  for (int i = 0; i < g.kd; ++i) {
    const long long d = d0 + (long long)i * g.dd;
    if (d < 0 || d >= g.D) continue;
    for (int j = 0; j < g.kh; ++j) {
      const long long h = h0 + (long long)j * g.dh;
      if (h < 0 || h >= g.H) continue;
      const long long row = (d * g.H + h) * g.W;
      for (int k = 0; k < g.kw; ++k) {
        const long long w = w0 + (long long)k * g.dw;
        if (w < 0 || w >= g.W) continue;
        const A c = (A)plane[row + w];
        if (pos < 0 || ops_isnan_bits(c) || (!ops_isnan_bits(best) && c > best)) { best = c; pos = row + w; }
      }
    }
  }
  return pos;
}

template <typename T, int MODE>
void forward(const T* x, T* y, int* yi, long long planes, const Geom& g) {
  const long long plane_in = g.D * g.H * g.W, total = planes * g.Do * g.Ho * g.Wo;
  for (long long o = 0; o < total; ++o) {
    long long plane, od, oh, ow;
    split(o, g.Wo, g.Ho, g.Do, plane, od, oh, ow);
    const T* xp = x + plane * plane_in;
    const long long pos = window_argmax(xp, g, od, oh, ow);
    if (MODE & 1) y[o] = pos >= 0 ? xp[pos] : T(neg_inf());
    if (MODE & 2) yi[o] = (int)pos;
  }
}

// TILE: the windows partition dx; each writes what it owns, the last window of a dim up to the input's edge
// (ceil_mode's partial windows stop short, floor mode's also own the remainder, which no window holds: 0).
// Otherwise windows are disjoint: zero dx, then write dy at each argmax.
template <typename T, bool TILE>
void backward_window(const T* x, const T* dy, T* dx, long long planes, const Geom& g) {
  const long long plane_in = g.D * g.H * g.W, total = planes * g.Do * g.Ho * g.Wo;
  if (!TILE) std::memset((void*)dx, 0, sizeof(T) * planes * plane_in);
  for (long long o = 0; o < total; ++o) {
    long long plane, od, oh, ow;
    split(o, g.Wo, g.Ho, g.Do, plane, od, oh, ow);
    const long long pos = window_argmax(x + plane * plane_in, g, od, oh, ow);
    T* dp = dx + plane * plane_in;
    if (TILE) {
      const long long d0 = od * g.kd, h0 = oh * g.kh, w0 = ow * g.kw;
      const long long ed = od == g.Do - 1 ? g.D - d0 : g.kd, eh = oh == g.Ho - 1 ? g.H - h0 : g.kh;
      const long long ew = ow == g.Wo - 1 ? g.W - w0 : g.kw;
      for (long long i = 0; i < ed; ++i)
        for (long long j = 0; j < eh; ++j)
          for (long long k = 0; k < ew; ++k) {
            const long long p = ((d0 + i) * g.H + h0 + j) * g.W + w0 + k;
            dp[p] = p == pos ? dy[o] : T(0.0f);
          }
    } else if (pos >= 0) {
      dp[pos] = dy[o];
    }
  }
}

// Each input element sums, in (od, oh, ow) order, dy of the windows that hold it and chose it: the CUDA
// kernel's work items (runs of RUN elements of a row, pool3d_gather.cuh) one after another.
template <typename T> struct GatherLoad {
  typename Acc<T>::type operator()(const T* p) const { return (typename Acc<T>::type)*p; }
};
template <typename T, int RUN>
void backward_gather(const int* idx, const T* dy, T* dx, long long planes, const Geom& g) {
  typedef typename Acc<T>::type A;
  const Pool3dWinR win = {g.kd, g.kh, g.kw, g.sd, g.sh, g.sw, g.dd, g.dh, g.dw};
  const Pool3dGatherDims gd = {(int)g.H, (int)g.W, (int)g.Do, (int)g.Ho, (int)g.Wo, g.pd, g.ph, g.pw};
  const long long plane_in = g.D * g.H * g.W, plane_out = g.Do * g.Ho * g.Wo;
  for (long long p = 0; p < planes; ++p)
    for (int id = 0; id < (int)g.D; ++id)
      for (int ih = 0; ih < (int)g.H; ++ih)
        for (int w0 = 0; w0 < (int)g.W; w0 += RUN) {
          const int n = std::min(RUN, (int)g.W - w0);
          A acc[RUN];
          pool3d_gather_run<A, RUN>(win, gd, idx + p * plane_out, dy + p * plane_out, id, ih, w0, n, acc,
                                    GatherLoad<T>());
          T* dp = dx + p * plane_in + ((long long)id * g.H + ih) * g.W + w0;
          for (int r = 0; r < n; ++r) dp[r] = from_acc<T>(acc[r]);
        }
}
}  // namespace pool3d_cpu
"""

_CPU_GEOM_FWD = "pool3d_cpu::geom(in0_shape1, in0_shape2, in0_shape3, out0_shape1, out0_shape2, out0_shape3, data)"
_CPU_SRC = {
    "fwd_cpu": "pool3d_cpu::forward<in0_type, ${MODE}>(${PTRS}, in0_shape0, " + _CPU_GEOM_FWD + ");",
    "bwd_window": "pool3d_cpu::backward_window<in0_type, ${TILE}>(in0_p, in1_p, out0_p, in0_shape0, "
                  "pool3d_cpu::geom(in0_shape1, in0_shape2, in0_shape3, in1_shape1, in1_shape2, in1_shape3, "
                  "data));",
    "bwd_gather_cpu": "pool3d_cpu::backward_gather<in1_type, ${VEC}>(in0_p, in1_p, out0_p, out0_shape0, "
                      "pool3d_cpu::geom(out0_shape1, out0_shape2, out0_shape3, in1_shape1, in1_shape2, "
                      "in1_shape3, data));",
}


def render_cpu(cfg: KernelConfig, mode: int = MODE_VALUES) -> str:
    """The ``cpu_src`` of one launch (CPU_HEADER holds the code)."""
    key = cfg.variant if cfg.variant in _CPU_SRC else "bwd_window"
    return _codegen.render(_CPU_SRC[key], MODE=mode, PTRS=_FWD_PTRS.get(mode, ""), VEC=cfg.vec,
                           TILE=str(cfg.variant == "bwd_tile_cpu").lower()) + "\n"


# ---- launches ---------------------------------------------------------------------------------------------

_CUDA_HEADER = None


def _cpu_header() -> str:
    """The CPU helpers, the gather math shared with CUDA (no includes), then the CPU loop nests."""
    return _codegen.cpu_common() + "\n" + _codegen.snippet("pool3d_gather") + "\n" + CPU_HEADER


def _cuda_header() -> str:
    global _CUDA_HEADER
    if _CUDA_HEADER is None:
        _CUDA_HEADER = _codegen.header(["common", "pool3d", "pool3d_gather"])
    return _CUDA_HEADER


def _code(shapes, dtypes, inputs, cfg: KernelConfig, params: PoolParams, mode: int = MODE_VALUES):
    if cfg.variant.endswith("_cpu"):
        return code(shapes, dtypes, inputs, cpu_header=_cpu_header(), cpu_src=render_cpu(cfg, mode),
                    data=params.data())
    return code(shapes, dtypes, inputs, cuda_header=_cuda_header(), cuda_src=render_cuda(cfg, params, mode))


def launch_forward(x, params: PoolParams, cfg: KernelConfig, mode: int = MODE_VALUES):
    """Pool the contiguous (planes, D, H, W) Var ``x``: the values, or [values, int32 indices] for mode 3."""
    out = (x.shape[0],) + output_shape(x.shape[1:], params)
    if mode == MODE_BOTH:
        return _code([out, out], [x.dtype, "int32"], [x], cfg, params, mode)
    return _code([out], [x.dtype], [x], cfg, params, mode)[0]


def launch_backward(x, dy, idx, params: PoolParams, cfg: KernelConfig):
    """dx of the (planes, D, H, W) input ``x`` given ``dy``; ``idx`` (the saved indices) for bwd_gather."""
    if cfg.variant.startswith("bwd_gather"):
        return _code([x.shape], [x.dtype], [idx, dy], cfg, params)[0]
    return _code([x.shape], [x.dtype], [x, dy], cfg, params)[0]


# ---- autograd ---------------------------------------------------------------------------------------------


class MaxPool3dFunction(jt.Function):
    """y[o] = max of x over window o; dx[e] = sum of dy[o] over the windows o whose argmax is e.

    Arguments: ``x`` (planes, D, H, W); ``params`` (:class:`PoolParams`); ``return_indices``; ``need_grad``
    (whether a backward may follow). The indices are saved (the forward writes them) when they are returned
    or the backward will gather (the default); under ``OPS_POOL3D_BWD=recompute`` the tile and scatter
    backwards recompute each window's argmax from x instead, so a forward of disjoint windows writes only the
    values.
    """

    def execute(self, x, params, return_indices, need_grad):
        self.x, self.params = x, params
        self.algorithm = backward_algorithm(params)  # fixed here: the indices are saved for it or not
        gather = need_grad and self.algorithm == "gather"
        with_indices = bool(return_indices or gather)
        cfg = select_config(x.shape, x.dtype, params, "fwd", indices=with_indices)
        if with_indices:
            y, idx = launch_forward(x, params, cfg, MODE_BOTH)
            self.idx = idx
            return (y, idx) if return_indices else y
        self.idx = None
        return launch_forward(x, params, cfg, MODE_VALUES)

    def grad(self, dy, *unused):
        if dy is None:
            return None, None, None, None
        x = self.x
        if dy.dtype != x.dtype:
            dy = dy.cast(x.dtype)
        cfg = select_config(x.shape, x.dtype, self.params, "bwd", algorithm=self.algorithm)
        return launch_backward(x, dy, self.idx, self.params, cfg), None, None, None


# ---- functional API and Module ----------------------------------------------------------------------------


def _check_input(x) -> None:
    if not isinstance(x, jt.Var):
        raise TypeError(f"x must be a jittor Var, got {type(x).__name__}")
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


def max_pool3d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """3-D max pooling over the last three dims of ``x`` ((N, C, D, H, W) or (C, D, H, W)).

    Returns the pooled Var, or ``(values, indices)`` with ``return_indices``: int32 flat positions
    ``(d * H + h) * W + w`` of each maximum in its (n, c) plane. Raises TypeError/ValueError naming the bad
    argument. Backward is deterministic (no atomics).
    """
    _check_input(x)
    params = normalize_params(kernel_size, stride, padding, dilation, ceil_mode)
    lead, spatial = tuple(x.shape[:-3]), tuple(x.shape[-3:])
    out_shape = lead + output_shape(spatial, params)
    planes = math.prod(lead)
    if planes == 0:  # an empty batch: nothing to pool
        values = jt.zeros(out_shape, dtype=x.dtype)
        return (values, jt.zeros(out_shape, dtype="int32")) if return_indices else values
    need_grad = not (jt.flags.no_grad or x.is_stop_grad())
    res = MaxPool3dFunction.apply(x.reshape((planes,) + spatial), params, bool(return_indices), need_grad)
    if return_indices:
        return res[0].reshape(out_shape), res[1].reshape(out_shape)
    return res.reshape(out_shape)


class MaxPool3d(jt.Module):
    """Module form of :func:`max_pool3d` (same arguments)."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        super().__init__()
        normalize_params(kernel_size, stride, padding, dilation, ceil_mode)  # fail at construction
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode, self.return_indices = dilation, ceil_mode, return_indices

    def execute(self, x):
        return max_pool3d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                          self.return_indices)
