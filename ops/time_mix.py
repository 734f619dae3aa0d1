"""timex: RWKV time-mix, a causal depthwise convolution whose kernel spans the whole sequence.

For ``w`` of shape (C, T) and ``k`` of shape (B, C, T)::

    out[b, c, t] = eps + sum_{u=0..t} w[c, T-1-(t-u)] * k[b, c, u]

the same as ``eps + conv1d(pad(k, (T-1, 0)), w.unsqueeze(1), groups=C)``. With the lag ``s = t - u`` and
``wr[c, s] = w[c, T-1-s]`` the gradients for an output gradient ``g`` are::

    grad_k[b, c, u]     = sum_{s=0..T-1-u} wr[c, s] * g[b, c, u+s]     (the forward on time-reversed g, reversed)
    grad_w[c, T-1-s]    = sum_b sum_{t=s..T-1} g[b, c, t] * k[b, c, t-s]

float16/bfloat16 inputs are accumulated in float32; outputs have the input dtype. grad_w is summed over the
batch inside the op, in a fixed order (no atomics): the same inputs give bit-identical gradients. Every sum
holds its own terms only, for any input values: terms outside it (u > t, the zero padding past T) are left
out by selection, never multiplied by a staged zero, so an Inf or NaN reaches only the sums that hold it
(timex.cuh: timex_fwd_step, timex_gw_step, timex_mma_exact_diagonal).

Layers (top to bottom):

* dispatch, pure Python: :func:`select_config` -> :class:`KernelConfig` (variant, the template constant ``tm``,
  launch geometry, shared memory, index type);
* launch: generated menus of the forward kernels (one translation unit per dtype and index type; the kernel
  chosen at run time through ``data``), :func:`forward_launch` (also grad_k), :func:`grad_w_launch`;
* a plan per call signature (``ops._launch.PlanCache``), recorded for autograd with ``_launch.taped``;
* the functional API :func:`timex` and the Module :class:`TimeX`.

Variants (``cuda_snippets/timex.cuh`` has the kernels; the CPU path runs the same per-block phase functions
block by block and thread by thread, so it exercises the GPU index math):

============ ============================================================================================
fwd_mma      CUDA on sm_80+, float16/bfloat16, T <= MMA_MAX_T: tensor cores (mma.sync TF32, exact for 16-bit
             inputs; 3xTF32 for float32 only where ``OPS_TIMEX_MMA=1`` forces it), one block per (channel,
             batch group of 8/16/32 rows, t-tile of 128). Forward and grad_k. CUDA only.
fwd_mma3     CUDA on sm_80+, float32 at any T and float16/bfloat16 past MMA_MAX_T: fwd_mma with each group of
             4 k-steps' products added to the totals by an FADD (accurate at any T), operands converted to
             TF32 once when staged, w staged per chunk in two stages, each A (w) word read once per group
             (A depends on t - u only). The tensor-core kernels run only where the batch fills MMA_MIN_FILL of
             their padded rows.
fwd_single   T <= FWD_SINGLE_MAX_T: one t-tile covers the sequence; one block per (channel, batch group)
             reads its k rows and w row once. Used for the forward and for grad_k (time-reversed).
fwd_tiled    longer T: t-tiles of FWD_TILE; the block of tile i walks u-chunks 0..i (i squares, 1 triangle).
gw_single    T <= GW_SINGLE_MAX_T: grad_w, one s-tile; one block per (channel, batch split).
gw_tiled     longer T: s-tiles of GW_TILE; the block of tile i walks v-chunks i..n-1.
============ ============================================================================================

Inside a block, threads own pairs of output groups (group i and group G-1-i), so the triangular chunk
costs every thread the same number of steps; lanes of a warp split over
batch rows (``lanes_b``) so that the lanes' groups stay close together and a warp's triangle divergence is
small. Forward threads also hold ``tm`` batch rows in registers, reusing each w value ``tm`` times.

The 16-byte accesses are shared-memory reads (each step: one float4 of w or k per row); global memory is
read once per chunk into shared memory with coalesced scalar loads, which take any T, any dtype, any row
alignment and the time-reversed reads of grad_k. That traffic is ~T/2 times smaller than the FMA work, so
wider global loads are predicted not to matter (to measure).

Performance, B32 C768 T768 on an H100 (docs/design.md): the CUDA-core forward 0.468 ms (31 TFLOP/s,
about half the FP32 FMA peak), fwd_mma3 0.291 ms in float32 (50 TFLOP/s), fwd_mma 0.181 ms in bfloat16; the
float32 backward (grad_k on the tensor cores + grad_w) 0.862 ms.

Compiles: one per (dtype, index type) for the forward menu (every forward kernel with every ``tm``; also grad_k)
and one for grad_w; the kernel, every size, tile and lane count go through the shapes and ``data``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence, Tuple

from . import _codegen
from . import _launch
from ._args import as_real
from ._calls import check_var, opening2
from ._jittor import jt
from .broadcast import cast_rounded

__all__ = ["timex", "TimeX", "KernelConfig", "select_config", "render_source", "forward_launch", "grad_w_launch",
           "launch_forward", "launch_grad_w", "direct_launch", "direct_grad_w_launch", "VARIANTS",
           "DTYPES"]

DTYPES = ("float32", "float16", "bfloat16")
VARIANTS = ("fwd_mma", "fwd_mma3", "fwd_single", "fwd_tiled", "gw_single", "gw_tiled")
_MMA_VARIANTS = {1: "fwd_mma", 3: "fwd_mma3"}

# ---- tuning constants (predicted where no measurement is given) -----------------------------------------

# Forward: one t-tile up to this length. The block then reads each k row once (global traffic = the
# minimum) and its shared memory stays <= 74 KB at 16 batch rows (3 blocks of 512 threads per SM). Beyond,
# a single tile would exceed the SM's shared memory for 16 rows at T ~ 3000, and balance degrades.
FWD_SINGLE_MAX_T = 1024
# Forward t-tile for longer T: 37 KB of shared memory at 16 rows (~6 blocks per SM); k rows are re-read
# (ntiles + 1) / 2 times on average, from L2 mostly, ~1/10 of the compute time at T = 4096.
FWD_TILE = 512
# grad_w: one s-tile up to this length; its shared memory is lanes_b * (3 * tile + 8) floats (49 KB at
# 8 rows and tile 512, the largest single tile).
GW_SINGLE_MAX_T = 512
# grad_w s-tile for longer T: 25 KB at 8 rows, 128 threads; more, smaller blocks balance better than 512.
GW_TILE = 256
# grad_w blocks wanted: splitting the batch over blocks (each writes a float32 partial row, summed in split
# order by a second kernel) until C * ntiles * splits reaches ~8 blocks per SM of an H200 (132 SMs).
GW_TARGET_BLOCKS = 1024
# Forward batch rows per thread (tm) and batch lanes per warp (lanes_b), by B: 16 rows per block (tm 4 x 4
# lanes) give 64 FMAs per 5 shared loads per step (~90% of issue slots on FMAs) and only 8 distinct t-lanes
# per warp (triangle divergence <= 7 steps); fewer rows for small B, where extra rows would be zero padding.
FWD_LANES_BY_B = ((16, 4), (8, 2), (1, 1))  # (min B, lanes_b)
# grad_w batch lanes: up to 8 rows per step; the k window load is per (row, lag group) either way, and more
# row lanes mean fewer distinct lag groups per warp (less triangle divergence).
GW_MAX_LANES = 8
# Tensor-core forward (also grad_k) on sm_80+ (H100, 2026-11-23; docs/design.md has the table). fwd_mma adds
# 8 products per mma unrounded: float32 outputs were off by up to 5x the tolerance at T = 4096, so it runs up to
# MMA_MAX_T (16-bit, exact in TF32: B32 C768 T768 bf16 0.180 ms against 0.268 on fwd_mma3, 0.480 on CUDA cores).
# fwd_mma3 for float32 (B32 C768 T768 0.291 ms against 0.468 on CUDA cores) and 16-bit past MMA_MAX_T.
MMA_MAX_T = 1024
# The kernels compute whole 8-row n-tiles: they run where the batch fills this share of its padded rows (the
# time per padded row against the CUDA cores' per row: 0.63-0.79 float32, 0.38-0.42 16-bit).
MMA_MIN_FILL = {"float32": 0.8, "float16": 0.5, "bfloat16": 0.5}
MMA_TILE, MMA_THREADS = 128, 128  # TIMEX_MMA_TILE / TIMEX_MMA_THREADS in timex.cuh
# OPS_TIMEX_MMA: "auto" (the default) the measured choice above; "0" CUDA cores only (FMA rounding in float32,
# for a user who wants it); "1" fwd_mma and "3" fwd_mma3 wherever they can run (fwd_mma up to MMA_MAX_T,
# fwd_mma3 at any T and B: the GPU tests reach every kernel through them).
MMA_SWITCH = "OPS_TIMEX_MMA"
TC_OFF, TC_MMA, TC_MMA3, TC_AUTO = 0, 1, 3, 4
_SWITCH_VALUES = {"auto": TC_AUTO, "0": TC_OFF, "1": TC_MMA, "3": TC_MMA3}
_launch.register_switch(MMA_SWITCH, tuple(_SWITCH_VALUES))
# fwd_mma3's shared memory per stage, in 32-bit words (TimexMma2Stage in timex.cuh): the k chunk and the
# 2 * 128 + 8 lag window, twice (big and small halves) for float32; two stages.
MMA2_WINDOW = 2 * MMA_TILE + 8
# CUDA grid y limit (t-tiles / s-tiles).
MAX_GRID_Y = 65535
# The kernels' launch bounds (TIMEX_FWD_MAX_THREADS / TIMEX_GW_MAX_THREADS in timex.cuh).
FWD_MAX_THREADS, GW_MAX_THREADS = 512, 256


# ---- dispatch ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelConfig:
    """One kernel launch: the variant, its compile-time constant, launch geometry and index type.

    ``groups`` is the number of batch groups per block row for the forward (blocks in x = C * groups) and the
    number of batch groups per split for grad_w (blocks in x = C * splits).
    """

    variant: str
    tm: int  # compile-time: batch rows per forward thread (1 for grad_w); fwd_mma: n-tiles (8 rows) per block
    lanes_b: int
    tile: int
    ntiles: int
    groups: int
    splits: int
    threads: int
    smem_bytes: int
    index_t: str

    @property
    def kernel(self) -> str:
        return "forward" if self.variant.startswith("fwd") else "grad_w"

    def data(self, **extra) -> dict:
        """Launch geometry as jt.code ``data`` (runtime kernel arguments)."""
        d = {"tile": self.tile, "lanes_b": self.lanes_b, "ntiles": self.ntiles, "threads": self.threads,
             "smem_bytes": self.smem_bytes}
        if self.kernel == "forward":
            d["groups_b"] = self.groups
        else:
            d["splits"], d["groups_per_split"] = self.splits, self.groups
        d.update(extra)
        return d


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def _check_shape(shape: Sequence[int]) -> Tuple[int, int, int]:
    if len(shape) != 3 or any(int(s) < 1 for s in shape):
        raise ValueError(f"k must have shape (B, C, T) with every size >= 1, got {tuple(shape)}")
    return tuple(int(s) for s in shape)


def tensor_cores_available() -> int:
    """The tensor-core mode for the forward here: TC_OFF (no CUDA in use, an arch below sm_80, or switched
    off), else what ``OPS_TIMEX_MMA`` asks: TC_AUTO (unset or "auto"), TC_MMA ("1") or TC_MMA3 ("3")."""
    switch = _launch.switch(MMA_SWITCH)
    if not _launch.on_cuda():
        return TC_OFF
    archs = list(jt.flags.cuda_archs)
    if not archs or min(archs) < 80:
        return TC_OFF
    return _SWITCH_VALUES[switch]


def _mma_n_tiles(B: int) -> int:
    """n-tiles of 8 batch rows per block of a tensor-core kernel (1, 2 or 4): the fewest padded rows (the
    work follows them), then the most rows per block (they share each A (w) fragment). B = 24 takes 3 blocks
    of 8 rows rather than one of 32."""
    return min((4, 2, 1), key=lambda nt: (_ceil_div(B, 8 * nt) * 8 * nt, -nt))


def _mma_config(B: int, C: int, T: int, version: int = 1, dtype: str = "float32") -> KernelConfig:
    nt = _mma_n_tiles(B)
    rows = 8 * nt
    ntiles = _ceil_div(T, MMA_TILE)
    if version == 3:
        halves = 2 if dtype == "float32" else 1
        smem = 4 * 2 * halves * (rows * (MMA_TILE + 4) + MMA2_WINDOW)
    else:
        smem = 4 * (rows * (MMA_TILE + 4) + (ntiles + 1) * MMA_TILE)
    return KernelConfig(variant=_MMA_VARIANTS[version], tm=nt, lanes_b=rows, tile=MMA_TILE,
                        ntiles=ntiles, groups=_ceil_div(B, rows), splits=1, threads=MMA_THREADS, smem_bytes=smem,
                        index_t=_codegen.index_type(B * C * T))


def _auto_tensor_core_version(B: int, T: int, dtype: str) -> int:
    """The tensor-core kernel TC_AUTO picks (1 fwd_mma, 3 fwd_mma3) or 0 for the CUDA cores (see MMA_MAX_T)."""
    rows = 8 * _mma_n_tiles(B)
    if B / (_ceil_div(B, rows) * rows) < MMA_MIN_FILL[dtype]:
        return 0
    if dtype == "float32":
        return 3
    return 1 if T <= MMA_MAX_T else 3


def select_config(k_shape: Sequence[int], kernel: str = "forward", *, single_max_t: int = None,
                  tile: int = None, tensor_cores: int = 0, dtype: str = "float32") -> KernelConfig:
    """The launch for k of shape (B, C, T) and ``dtype``: ``kernel`` "forward" (also grad_k) or "grad_w".

    ``tensor_cores``: the forward's tensor-core mode (TC_AUTO: the measured choice; TC_MMA, TC_MMA3:
    that kernel wherever it can run; TC_OFF: CUDA cores); the caller knows the device
    (:func:`tensor_cores_available`).
    ``single_max_t``/``tile`` override the tuning constants (tests use them to reach the tiled paths with
    small, fast shapes); ``tile`` is rounded up to the kernel's thread granularity.
    """
    B, C, T = _check_shape(k_shape)
    forced = single_max_t is not None or tile is not None
    if kernel == "forward" and tensor_cores and not forced:
        mode = tensor_cores
        if mode == TC_MMA3:  # at any T
            return _mma_config(B, C, T, version=3, dtype=dtype)
        if mode == TC_MMA and T <= MMA_MAX_T:
            return _mma_config(B, C, T)
        if mode == TC_AUTO:
            version = _auto_tensor_core_version(B, T, dtype)
            if version:
                return _mma_config(B, C, T, version=version, dtype=dtype)
    if kernel == "forward":
        tm = 1 if B == 1 else 2 if B == 2 else 4
        lanes = next(lb for min_b, lb in FWD_LANES_BY_B if B >= min_b)
        rows = lanes * tm
        unit = 256 // lanes  # tile = 8 * threads / lanes_b, threads a multiple of 32
        single = FWD_SINGLE_MAX_T if single_max_t is None else single_max_t
        size = _round_up(T, unit) if T <= single else _round_up(FWD_TILE if tile is None else tile, unit)
        threads = lanes * size // 8
        smem = 4 * (rows * (size + 4) + 2 * size)
        groups, splits = _ceil_div(B, rows), 1
        numel = B * C * T
        variant = "fwd_single" if size >= T else "fwd_tiled"
    elif kernel == "grad_w":
        tm = 1
        lanes = min(GW_MAX_LANES, 1 << (B.bit_length() - 1))
        unit = 512 // lanes  # tile = 16 * threads / lanes_b
        single = GW_SINGLE_MAX_T if single_max_t is None else single_max_t
        size = _round_up(T, unit) if T <= single else _round_up(GW_TILE if tile is None else tile, unit)
        threads = lanes * size // 16
        smem = 4 * lanes * (3 * size + 8)
        ngroups = _ceil_div(B, lanes)
        ntiles = _ceil_div(T, size)
        wanted = max(1, _ceil_div(GW_TARGET_BLOCKS, C * ntiles))
        groups = _ceil_div(ngroups, min(ngroups, wanted))
        splits = _ceil_div(ngroups, groups)
        numel = max(B, splits) * C * T
        variant = "gw_single" if size >= T else "gw_tiled"
    else:
        raise ValueError(f"kernel must be 'forward' or 'grad_w', got {kernel!r}")
    limit = FWD_MAX_THREADS if kernel == "forward" else GW_MAX_THREADS
    if threads > limit:
        raise ValueError(f"tile {size} needs {threads} threads per block, above the kernel's {limit}")
    ntiles = _ceil_div(T, size)
    if ntiles > MAX_GRID_Y:
        raise ValueError(f"k: T = {T} is too long for this kernel ({ntiles} tiles > {MAX_GRID_Y})")
    return KernelConfig(variant=variant, tm=tm, lanes_b=lanes, tile=size, ntiles=ntiles, groups=groups,
                        splits=splits, threads=threads, smem_bytes=smem, index_t=_codegen.index_type(numel))


# ---- launch: menus ----------------------------------------------------------------------------------------
#
# One translation unit per (dtype, index type) for the forward (also grad_k): a generated menu switches over its
# kernels (CUDA cores with tm = 1, 2, 4; the tensor-core kernels with 1, 2, 4 n-tiles), the choice and the
# geometry arriving through `data`; one for grad_w. The CPU path has its own menu of the host loops.

_TMS = (1, 2, 4)
_FWD_CUDA_MENU = _codegen.Menu([("launch", tm) for tm in _TMS]
                               + [(fn, nt) for fn in ("mma_launch", "mma3_launch") for nt in _TMS],
                               lambda e: f"timex_fwd_{e[0]}<T, {e[1]}, I>(w, k, out, p)")
_FWD_CPU_MENU = _codegen.Menu([("host", tm) for tm in _TMS], lambda e: f"timex_fwd_{e[0]}<T, {e[1]}, I>(w, k, out, p)")
_MENU_HEAD = ("template <typename T, typename I>\n"
              "void timex_fwd_menu(int v, const T* w, const T* k, T* out, const TimexFwdParams& p)")


def _fwd_entry(cfg: KernelConfig, device: str) -> tuple:
    if cfg.variant in _MMA_VARIANTS.values():
        return (cfg.variant[len("fwd_"):] + "_launch", cfg.tm)
    return ("launch" if device == "cuda" else "host", cfg.tm)


@functools.lru_cache(maxsize=None)
def _header(device: str) -> str:
    menu = _FWD_CUDA_MENU if device == "cuda" else _FWD_CPU_MENU
    text = f"// ops: timex {device} menu (generated by ops/time_mix.py)\n#pragma once\n" + menu.render(_MENU_HEAD, "timex")
    # CPU: cpu_common.h first, timex_store rounds bfloat16 to nearest even through it, as the GPU does
    names = ("common", "timex") if device == "cuda" else ("cpu_common.h", "timex")
    return _codegen.include(names, (_codegen.generated(f"timex_{device}_menu", text),))


_FORWARD_SRC = ("timex_fwd_menu<in0_type, ${IT}>((int)data[\"v\"], in0_p, in1_p, out0_p, "
                "timex_fwd_params(in1_shape0, in1_shape1, in1_shape2, data));")
_GRAD_W_CALL = ("timex_gw_${FN}<in0_type, ${IT}>(in0_p, in1_p, out0_p, out1_p, "
                "timex_gw_params(in0_shape0, in0_shape1, in0_shape2, data));")


def render_source(cfg: KernelConfig, device: str) -> str:
    """The launcher call of ``cfg`` on ``device`` ("cuda" or "cpu"): the forward's menu entry, or grad_w's."""
    if cfg.kernel == "grad_w":
        return _codegen.render(_GRAD_W_CALL, FN={"cuda": "launch", "cpu": "host"}[device], IT=cfg.index_t)
    if cfg.variant in _MMA_VARIANTS.values() and device == "cpu":
        raise ValueError(f"the {cfg.variant} kernel is CUDA-only")
    fn, tm = _fwd_entry(cfg, device)
    return f"timex_fwd_{fn}<in0_type, {tm}, {cfg.index_t}>(...)"


def forward_launch(cfg: KernelConfig, shape, dtype: str, eps: float, reverse: bool, cuda: bool) -> _launch.Launch:
    """``eps`` + the causal convolution of k (B, C, T) with w (C, T); ``reverse``: both in reversed time."""
    device = "cuda" if cuda else "cpu"
    menu = _FWD_CUDA_MENU if cuda else _FWD_CPU_MENU
    data = cfg.data(reverse=int(bool(reverse)), eps=float(eps), v=menu.index(_fwd_entry(cfg, device)))
    data = _launch.pack_named(data)  # both devices read it by name (ops_data.h)
    return _launch.Launch(tuple(shape), dtype, cuda=cuda, src=_codegen.render(_FORWARD_SRC, IT=cfg.index_t),
                          header=_header(device), data=data)


def grad_w_launch(cfg: KernelConfig, shape, dtype: str, cuda: bool) -> _launch.Launch:
    """grad_w (C, T) and its float32 per-split partial sums from k and the output gradient (both (B, C, T))."""
    B, C, T = shape
    device = "cuda" if cuda else "cpu"
    return _launch.Launch([(C, T), (cfg.splits, C, T)], [dtype, "float32"], cuda=cuda,
                          src=render_source(cfg, device), header=_header(device),
                          data=_launch.pack_named(cfg.data()))


_DIRECT_SRC = "timex_fwd_direct<in0_type>(in0_p, in1_p, out0_p, in1_shape0, in1_shape1, in1_shape2, data);"


def direct_launch(shape, dtype: str, eps: float, reverse: bool) -> _launch.Launch:
    """The CPU forward of the plans (``reverse``: grad_k): each output's causal sum as one dot product of
    contiguous runs (``timex_fwd_direct``); one compile per dtype, every shape."""
    return _launch.Launch(tuple(shape), dtype, cuda=False, src=_DIRECT_SRC, header=_header("cpu"),
                          data={"e": float(eps), "r": int(bool(reverse))})


_DIRECT_GW_SRC = "timex_gw_direct<in0_type>(in0_p, in1_p, out0_p, in0_shape0, in0_shape1, in0_shape2);"


def direct_grad_w_launch(shape, dtype: str) -> _launch.Launch:
    """The CPU grad_w of the plans: each lag's sum as dot products of contiguous runs (``timex_gw_direct``)."""
    B, C, T = shape
    return _launch.Launch((C, T), dtype, cuda=False, src=_DIRECT_GW_SRC, header=_header("cpu"))


def launch_forward(w, k, eps: float, reverse: bool = False, cfg: KernelConfig = None):
    """Run the forward (``reverse``: grad_k = launch_forward(w, g, 0, reverse=True)) where jittor runs now."""
    dtype = str(k.dtype)
    cfg = cfg or select_config(k.shape, "forward", tensor_cores=tensor_cores_available(), dtype=dtype)
    return forward_launch(cfg, k.shape, dtype, eps, reverse, _launch.on_cuda())([w, k])


def launch_grad_w(k, g, cfg: KernelConfig = None):
    """grad_w (C, T) for ``k`` and the output gradient ``g`` (both (B, C, T), the same dtype)."""
    cfg = cfg or select_config(k.shape, "grad_w")
    return grad_w_launch(cfg, k.shape, str(k.dtype), _launch.on_cuda())([k, g])[0]


# ---- plans: one per call signature ------------------------------------------------------------------------


class _Plan:
    """timex of one signature where a backward may follow: the forward launch recorded for autograd
    (``_launch.taped``): grad_k is the forward kernel on time-reversed dy, grad_w its own kernel (both launches
    made on the first backward). Without a backward to follow, the plan is the bound forward launch."""

    __slots__ = ("forward_launch", "grad_key", "_grad")

    def __init__(self, forward, grad_key):
        self.forward_launch, self.grad_key, self._grad = forward, grad_key, None

    def forward(self, inputs):
        return self.forward_launch(inputs)

    def grad(self, w, k, dout):
        shape, dtype, cfg, cuda = self.grad_key
        if self._grad is None:
            if cuda:
                gw = grad_w_launch(select_config(shape, "grad_w"), shape, dtype, True)
                self._grad = (forward_launch(cfg, shape, dtype, 0.0, True, True), lambda ins: gw(ins)[0])
            else:
                self._grad = (direct_launch(shape, dtype, 0.0, True), direct_grad_w_launch(shape, dtype))
        if str(dout.dtype) != dtype:  # bfloat16 rounded to nearest even (jittor's CPU cast truncates)
            dout = cast_rounded(dout, dtype)
        grad_k, grad_w = self._grad
        return grad_w([k, dout]), grad_k([w, dout])

    def __call__(self, w, k):
        return _launch.taped((w, k), self.forward, lambda dout: self.grad(w, k, dout))


class _EmptyPlan:
    """timex of an empty k (B, C or T zero): an empty output; w and k get zero gradients (no term reaches them)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

    def __call__(self, w, k):
        return jt.zeros(self.shape, self.dtype)


def _plan(shape: Tuple[int, int, int], dtype: str, eps: float, need_grad: bool, cuda: bool):
    if math.prod(shape) == 0:
        return _EmptyPlan(shape, dtype)
    cfg = select_config(shape, "forward", tensor_cores=tensor_cores_available(), dtype=dtype)
    select_config(shape, "grad_w")  # a T too long for the grid fails here, not inside a backward
    forward = forward_launch(cfg, shape, dtype, eps, False, cuda) if cuda else direct_launch(shape, dtype, eps, False)
    if not need_grad:
        return forward.bind(2)  # the call is the launch alone
    return _Plan(forward, (shape, dtype, cfg, cuda))


_PLANS = _launch.PlanCache("timex")  # the entry point checks its recent calls first (PlanCache.planned)


# ---- functional API and Module ----------------------------------------------------------------------------


def _check_eps(eps) -> float:
    return as_real(eps, "eps")


def _check_operand(v, name: str, ndim: int, dims: str):
    check_var(v, name)
    dtype = str(v.dtype)
    if dtype not in DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {dtype}")
    if len(v.shape) != ndim:
        raise ValueError(f"{name} must have shape {dims}, got {len(v.shape)} dims {tuple(v.shape)}")


def _validate(w, k, eps) -> float:
    _check_operand(w, "w", 2, "(C, T)")
    _check_operand(k, "k", 3, "(B, C, T)")
    if tuple(k.shape[1:]) != tuple(w.shape):
        raise ValueError(f"w must have shape (C, T) = k.shape[1:] = {tuple(k.shape[1:])}, got {tuple(w.shape)}")
    if str(w.dtype) != str(k.dtype):
        raise TypeError(f"w and k must have the same dtype, got w {w.dtype} and k {k.dtype}")
    return _check_eps(eps)


def _plan_of(w, k, eps, need_grad: bool):
    """The plan of ``timex(w, k, eps)``, after checking its arguments."""
    eps = _validate(w, k, eps)
    return _plan(tuple(int(n) for n in k.shape), str(k.dtype), eps, need_grad, _launch.on_cuda())


_open = opening2(_PLANS, _plan_of, ("w", "k"))


def timex(w, k, eps=0.0):
    """RWKV time-mix: ``out[b, c, t] = eps + sum_{u<=t} w[c, T-1-(t-u)] * k[b, c, u]``.

    ``w``: (C, T); ``k``: (B, C, T), both float32, float16 or bfloat16 (the same dtype; float16/bfloat16 are
    accumulated in float32 and rounded to nearest even); ``eps``: a finite real number added to every output (a
    Python or NumPy number, or a one-element Var). Returns (B, C, T) in k's dtype; an empty k (B, C or T zero)
    gives an empty result. Differentiable in ``w`` and ``k`` (deterministic gradients).

    Each output (and each gradient element) sums its own terms only, as IEEE would: an Inf or NaN in k at step
    u reaches out[..., t] for t >= u only (0 * Inf inside a sum is NaN), never an earlier output.
    """
    if type(eps) is not float:  # a NumPy scalar, a one-element Var: its value keys the plan (a Var is unhashable)
        eps = _check_eps(eps)
    return _open(w, k, eps)


class TimeX(jt.Module):
    """Layer of :func:`timex`: ``TimeX(eps)(w, k) == timex(w, k, eps)``; ``eps`` (a finite real number, a NumPy
    scalar or a one-element Var) is checked here and kept as a float."""

    def __init__(self, eps=0.0):
        super().__init__()
        self.eps = _check_eps(eps)

    def execute(self, w, k):
        """``out[b, c, t] = eps + sum_{u<=t} w[c, T-1-(t-u)] * k[b, c, u]`` for ``w`` (C, T) and ``k`` (B, C, T)."""
        return timex(w, k, self.eps)

    forward = execute

    def extra_repr(self) -> str:
        return f"eps={self.eps}"
