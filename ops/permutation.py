"""permute / transpose / transpose_add: a dtype-free permute and the fused ``x.transpose(d0, d1) + y``.

Layers (top to bottom):

* shape algebra, pure Python: :func:`normalize_dims`, :func:`simplify_permutation` (drop size-1 dims, merge
  dims that stay adjacent), :func:`movement_size` (the widest chunk of 16/8/4/2/1 bytes the last dim allows),
  :func:`plan_permute` (both together: the problem in "moved elements");
* dispatch: :func:`select_config` -> :class:`KernelConfig` (variant, template constants, launch geometry,
  index type, and the runtime values handed to the kernel through ``data``);
* launch: :func:`render` (the few lines of ``cuda_src`` that call a launcher of ``cuda_snippets/permute.cuh``),
  :func:`cpu_plan_data` and ``cuda_snippets/permute_cpu.h`` (the CPU path: rows copied whole, or L1 tiles of
  the transposed plane), :func:`launch`;
* :class:`PermuteFunction`, :class:`TransposeAddFunction` (``jt.Function``, used through ``.apply``);
* the functional API :func:`permute`, :func:`transpose`, :func:`transpose_add`, and the Modules
  :class:`Permute`, :class:`TransposeAdd`.

Variants (the same names for both ops where they apply):

========== =========================================================================================
copy       permute only: identity after simplification; ``cudaMemcpyAsync`` / ``memcpy``.
add        transpose_add only: identity after simplification (``d0 == d1`` or swapped size-1 dims); the
           N-d kernel at rank 1, 16-byte words on x, y and the output where the size allows.
general    the N-d kernel: rank R <= 8 after simplification, OpsDivisor index arithmetic. Picked when the
           last dim stays in place (moved in chunks of up to 16 bytes, coalesced on both sides) or when
           the last dim moves but a tile dim is below ``TILE_MIN_DIM``.
tiled      the last dim moves: 32x32-element shared-memory tile of the (input last dim, output last dim)
           plane for every index of the other dims (covers (1,0), (0,2,1) and N-d cases like (0,4,2,1,3)).
           Split B (template constant ``SB``, data key ``split_b``): where the output's last dim is below
           ``TILE_MIN_DIM``, the plane's B side is the output's last two dims together (contiguous in the
           output, two strides in the input): (3,1,4,2,0) on (8,24,40,16,64) tiles 64 x (40 * 8).
tiled_packed  as tiled for 1-, 2- and 4-byte elements, with P elements in one 4- or 8-byte word per global
           access on both sides of a 32P-element tile: int8/bool quads (P = 4, 4 bytes), fp16/bf16 pairs
           (P = 2) or quads (P = 4, 8 bytes), float32 pairs (P = 2, 8 bytes); the word is chosen by the
           measured rule at ``WORD8_MIN_ROW_BYTES``.
           Both tiled variants: consecutive blocks step along the output's last dim, and where a permute's
           output rows do not start on 32-byte sectors the shifted tile (template constant ``AL``, data key
           ``align``) starts every output row segment on a unit of 32 or 64 bytes (rule at
           ``ALIGN_OUT``). Loose words (template constant ``LW``, data key ``loose``; the measured
           rule at ``LOOSE_WORD``: 1-byte elements, and 4-byte ones in transpose_add): packed words
           in shared memory for rows that do not start on a word, their elements moved one at a time on
           the global side.
tiled_grouped  the last dim stays but holds only G = 2, 4 or 8 chunks (e.g. 64 bytes): a tile whose
           elements are those groups, so reads and writes both move runs of 512 bytes or more where the
           general kernel reads runs of G chunks ((1,0,2) on (2048,1024,16) float32, attention layouts).
fallback   permute only: more than ``MAX_RANK`` dims remain after simplification; jittor's own permute.
========== =========================================================================================

Every integer written into the CUDA source text (rank, chunk bytes, pack, batch rank, index type, block
shape, the shifted tile's unit, and the element type for transpose_add) changes the generated code; shapes
and strides go through ``data`` so one compiled kernel serves every shape of a kind. The CPU source takes
everything from ``data`` (:func:`cpu_plan_data`): one CPU compile per dtype and op.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

from . import _codegen
from . import _launch
from ._args import as_index, as_index_sequence, is_sequence
from ._calls import opening1, opening2, reshape as _reshape
from ._jittor import jt

__all__ = ["permute", "transpose", "transpose_add", "Permute", "TransposeAdd", "KernelConfig", "PermutePlan",
           "normalize_dims", "simplify_permutation", "movement_size", "plan_permute", "select_config", "render",
           "menu", "cuda_header", "launch", "run_config", "cpu_plan_data", "VARIANTS"]

# ---- tuning constants -------------------------------------------------------------------------------------

# Templates and the CPU walker hold up to 8 simplified dims; more falls back to jittor's permute.
MAX_RANK = 8
# Chunk sizes the byte mover can use, widest first; 16 bytes is the widest single load/store on the GPU.
CHUNKS = (16, 8, 4, 2, 1)
# General kernel: 4 chunks of 16 B in flight per thread keep ~64 KB per SM outstanding (predicted ~90% of copy).
ND_THREADS = 256
ND_UNROLL = 4
# Grouped tile: 8 thread rows; (32,512,16,64) f16 attention layout 87.7% of copy against 83.3 at 4, 86.1 at 16.
TILE_ROWS = 8
# Tiled kernel: 8 words per thread and phase (rows = 32P / 8); (4097, 3071) f16 67.5% of copy against 53.2 at 16.
TILE_WORDS_PER_THREAD = 8
# Both tile-plane dims at least 16: at 8, (8,24,40,16,64) f16 (3,1,4,2,0) fell from 28.7 to 15.0% of copy.
TILE_MIN_DIM = 16
# 4-byte packed words only where both plane dims fill half the tile (not measured on its own).
PACK_MIN_FILL = 16
# 8-byte words (else 4-byte) for 4-byte elements, and for 2-byte ones whose tile rows lie >= 16 KB apart
# ((24300, 11520) bf16 transpose_add 70.2 -> 82.1% of copy) or whose op touches <= 32 MB (stays in L2: 84 -> 96);
# elsewhere they lost 1-5 points.
WORD8_MIN_ROW_BYTES = 16 << 10
WORD8_L2_BYTES = 32 << 20
# Packed word: "auto" (the rule above), "4" or "8" (the tests force each to reach every kernel path).
PACK_WORD = "auto"
# Tiled blocks step along B, the output's last dim: (24300, 11520) bf16 transpose_add 80.4 -> 89.9% of copy
# ("a": along A, reached by the tests).
TILE_ORDER = "b"
# Shifted tile for permute output rows off a 32-byte sector: 32-byte units for packed words ((24300, 11520) bf16
# 78.1 -> 92.5% of copy), 64-byte units for 4-byte elements ((4097, 3071) f32 70.0 -> 82.8); never for 2-byte
# words (58.1 -> 49.2) or transpose_add (89.9 -> 71.8). "auto" that rule; "0", "32", "64" forced (tests).
ALIGN_OUT = "auto"
# Loose words where rows do not start on a word: 4-byte words for 1-byte elements (int8 (4097, 3071) 33.4 ->
# 50.2% of copy), 8-byte words for 4-byte ones in transpose_add (73.5 -> 82.2); 2-byte elements always lost
# (67.0 -> 55.2). "auto" that rule; "0", "4", "8" forced (tests).
LOOSE_WORD = "auto"
# Grouped tile: the last dim stays and holds G chunks; taken for G in GROUPS (a warp covers whole groups:
# G divides 32) when the a dim fills a tile row (32 / G groups) and the b dim at least TILE_MIN_DIM. Predicted
# (1,0,2) on (2048,1024,16) float32 from 79% (general, 64-byte runs) to ~90% of copy on an H100.
GROUPS = (2, 4, 8)

VARIANTS = {
    "permute": ("copy", "general", "tiled", "tiled_packed", "tiled_grouped", "fallback"),
    "transpose_add": ("add", "general", "tiled", "tiled_packed", "tiled_grouped"),
}

# ---- shape algebra ----------------------------------------------------------------------------------------


def normalize_dims(ndim: int, dims: Sequence, name: str = "dims") -> Tuple[int, ...]:
    """``dims`` as a permutation of ``range(ndim)`` (negative dims counted from the end).

    Raises TypeError (not ints) or ValueError (wrong length, out of range, repeated), naming ``name``.
    """
    dims = tuple(as_index(d, f"{name}[{i}]") for i, d in enumerate(dims))
    if len(dims) != ndim:
        raise ValueError(f"{name} must list each of the {ndim} dims of x once, got {len(dims)} dims {dims}")
    out = []
    for d in dims:
        if not -ndim <= d < ndim:
            raise ValueError(f"{name}: dim {d} is out of range for a tensor of {ndim} dims")
        out.append(d % ndim)
    if len(set(out)) != ndim:
        raise ValueError(f"{name} must be a permutation of the dims (each once), got {dims}")
    return tuple(out)


def simplify_permutation(shape: Sequence[int], perm: Sequence[int]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """The smallest equivalent problem: ``(in_dims, perm)``.

    Size-1 dims are dropped and input dims that stay adjacent and in order in the output are merged, e.g.
    (5,6,7,8) with (2,3,0,1) becomes (30,56) with (1,0). An identity comes back as ``((numel,), (0,))``.
    """
    keep = [i for i, s in enumerate(shape) if s != 1]
    renumber = {old: new for new, old in enumerate(keep)}
    dims = [shape[i] for i in keep]
    order = [renumber[p] for p in perm if shape[p] != 1]
    groups = []  # runs of consecutive input dims, in output order
    for p in order:
        if groups and p == groups[-1][-1] + 1:
            groups[-1].append(p)
        else:
            groups.append([p])
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    new_index = {g: i for i, g in enumerate(by_input)}
    in_dims = tuple(math.prod(dims[i] for i in groups[g]) for g in by_input)
    new_perm = tuple(new_index[g] for g in range(len(groups)))
    if len(in_dims) <= 1:
        return (math.prod(shape),), (0,)
    return in_dims, new_perm


def movement_size(nbytes: int) -> int:
    """The widest chunk (16/8/4/2/1 bytes) that divides ``nbytes``: rows of that many bytes start at multiples
    of it, and jittor buffers are 256-byte aligned, so every chunk access is aligned."""
    return next(c for c in CHUNKS if nbytes % c == 0)


@dataclass(frozen=True)
class PermutePlan:
    """A permute in units of moved elements of ``chunk`` bytes: input dims (row-major) and the permutation."""

    in_dims: Tuple[int, ...]
    perm: Tuple[int, ...]
    chunk: int

    @property
    def rank(self) -> int:
        return len(self.in_dims)

    @property
    def count(self) -> int:
        return math.prod(self.in_dims)

    @property
    def out_dims(self) -> Tuple[int, ...]:
        return tuple(self.in_dims[p] for p in self.perm)

    @property
    def is_identity(self) -> bool:
        return self.perm == tuple(range(self.rank))

    @property
    def last_moves(self) -> bool:
        return self.perm[-1] != self.rank - 1


def plan_permute(shape: Sequence[int], perm: Sequence[int], itemsize: int) -> PermutePlan:
    """Simplify, then move the widest chunk when the last dim stays in place (a dtype-free byte mover).

    A last dim that becomes a single chunk disappears, e.g. (1024,1024,4) float32 with (1,0,2) is a (1,0)
    transpose of (1024,1024) 16-byte elements.
    """
    dims, p = simplify_permutation(shape, perm)
    if p[-1] != len(dims) - 1:
        return PermutePlan(dims, p, itemsize)
    chunk = movement_size(dims[-1] * itemsize)
    dims = dims[:-1] + (dims[-1] * itemsize // chunk,)
    dims, p = simplify_permutation(dims, p)
    return PermutePlan(dims, p, chunk)


def _strides(dims: Sequence[int]) -> Tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(dims):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


# ---- dispatch ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelConfig:
    """What ``select_config`` decided for one call.

    ``chunk`` is the byte size of a moved element (E of the tiled kernels), ``pack`` the elements per 4- or
    8-byte word of ``tiled_packed`` (1 otherwise), ``batch_rank`` the dims outside the tile plane, ``block``/``grid``
    the launch geometry and ``params`` the runtime values passed as ``data`` (never in the source text).
    """

    op: str
    variant: str
    dtype: str
    rank: int
    chunk: int
    pack: int
    batch_rank: int
    index_type: str
    block: Tuple[int, ...]
    grid: int
    params: Tuple[Tuple[str, int], ...]

    @property
    def data(self) -> Dict[str, int]:
        return dict(self.params)


def _word8_wins(plan: PermutePlan, op: str, row_elems: int) -> bool:
    """Whether 8-byte words beat 4-byte ones (the measured rule above); ``row_elems`` is the smaller of the
    input and output strides of the tile's rows."""
    if plan.chunk == 4:
        return True
    touched = plan.count * plan.chunk * (3 if op == "transpose_add" else 2)
    return row_elems * plan.chunk >= WORD8_MIN_ROW_BYTES or touched <= WORD8_L2_BYTES


def _b_fast() -> bool:
    """Whether consecutive tiles of the tiled kernel step along B (the output's last dim) rather than A: always,
    unless ``TILE_ORDER`` says "a" (the measured choice above)."""
    return TILE_ORDER != "a"


def _align_for(op: str, chunk: int, pack: int, row_steps: Sequence[int]) -> int:
    """Elements per aligned unit of the shifted tile (0: the plain tile) for elements of ``chunk`` bytes moved
    ``pack`` to a word; ``row_steps`` are the element distances between the output rows a tile writes (the
    A dim's and the batch dims' output strides). The measured rule above, or the forced unit."""
    mode = ALIGN_OUT
    if mode == "auto":
        if op != "permute" or chunk * pack < 4 or all(step * chunk % 32 == 0 for step in row_steps):
            return 0
        unit_bytes = 32 if pack > 1 else 64
    else:
        unit_bytes = int(mode)
    if unit_bytes <= chunk * pack:
        return 0
    unit = unit_bytes // chunk
    extra = unit - pack  # input rows the tile holds before its b range
    return unit if extra < 32 * pack else 0


def _loose_pack_for(chunk: int, op: str, a: int, b: int) -> int:
    """Elements per loose word (1: none) where the aligned words do not fit: ``LOOSE_WORD`` (under "auto" the
    measured rule above), filled as the aligned words are (a whole tile edge for 8-byte words, PACK_MIN_FILL
    words for 4-byte ones)."""
    mode = LOOSE_WORD
    if mode == "auto":
        mode = "4" if chunk == 1 else ("8" if chunk == 4 and op == "transpose_add" else "0")
    if mode == "0" or chunk > 4 or (chunk == 4 and mode == "4"):
        return 1
    word = 4 if chunk == 1 else int(mode)
    pack = word // chunk
    return pack if _tile_fills(word, pack, a, b) else 1


def _tile_fills(word: int, pack: int, a: int, b: int) -> bool:
    """Whether both plane dims fill the packed tile of ``pack`` elements per ``word``-byte word: a whole tile
    edge for 8-byte words, ``PACK_MIN_FILL`` words for 4-byte ones."""
    return min(a, b) >= (32 if word == 8 else PACK_MIN_FILL) * pack


def _pack_for(plan: PermutePlan, op: str, a: int, b: int, row_elems: int) -> int:
    """Elements per packed word for the tiled path (1: the plain 32x32 tile): 8-byte words for 2- and 4-byte
    elements where they win (or are forced) and the tile is whole, else 4-byte words where those fit. Only
    aligned words: every row of both sides starts on a word (``a`` and ``b`` are multiples of the pack)."""
    if plan.chunk > 4:
        return 1
    mode = PACK_WORD
    if plan.chunk > 1 and mode != "4" and (mode == "8" or _word8_wins(plan, op, row_elems)):
        pack = 8 // plan.chunk
        if a % pack == 0 and b % pack == 0 and _tile_fills(8, pack, a, b):
            return pack
    pack = 4 // plan.chunk
    if pack == 1 or a % pack or b % pack or not _tile_fills(4, pack, a, b):
        return 1
    return pack


def _tile_rows(chunk: int, pack: int) -> int:
    """Thread rows of the tiled kernel's block (``TILE_WORDS_PER_THREAD``); 1-byte elements keep ``TILE_ROWS``."""
    return TILE_ROWS if chunk == 1 else 32 * pack // TILE_WORDS_PER_THREAD


def _tile_b_dims(plan: PermutePlan) -> Tuple[int, ...]:
    """The input dims that make the tile plane's B side, in output order: the output's last dim, or where that
    is below ``TILE_MIN_DIM`` the output's last two (split B), unless the second-to-last is the A side (the
    input's last dim). The two are contiguous in the output; simplification left them apart in the input."""
    last = plan.perm[-1]
    if plan.in_dims[last] >= TILE_MIN_DIM or plan.rank < 3 or plan.perm[-2] == plan.rank - 1:
        return (last,)
    return (plan.perm[-2], last)


def _choose_variant(plan: PermutePlan, op: str) -> Tuple[str, int, bool]:
    """(variant, pack, loose words) for a simplified plan: the dispatch ladder."""
    if plan.is_identity:
        return ("copy" if op == "permute" else "add"), 1, False
    if plan.rank > MAX_RANK:  # only a permute: a swap of two dims simplifies to at most 5 dims
        return "fallback", 1, False
    a_size = plan.in_dims[-1]  # input last dim (contiguous in the input)
    b_dims = _tile_b_dims(plan) if plan.last_moves else (plan.perm[-1],)
    b_size = math.prod(plan.in_dims[k] for k in b_dims)  # the output's last dim(s)
    if not plan.last_moves:
        group = plan.in_dims[-1]  # chunks per row of the staying last dim
        if (group in GROUPS and plan.in_dims[-2] >= 32 // group
                and plan.in_dims[plan.perm[-2]] >= TILE_MIN_DIM):
            return "tiled_grouped", 1, False
        return "general", 1, False
    if min(a_size, b_size) < TILE_MIN_DIM:
        return "general", 1, False
    in_strides, out_strides = _strides(plan.in_dims), _strides(plan.out_dims)
    row_elems = min(in_strides[b_dims[-1]], out_strides[plan.perm.index(plan.rank - 1)])
    pack, loose = _pack_for(plan, op, a_size, b_size, row_elems), False
    if pack == 1:
        pack = _loose_pack_for(plan.chunk, op, a_size, b_size)
        loose = pack > 1
    return ("tiled_packed" if pack > 1 else "tiled"), pack, loose


def select_config(shape: Sequence[int], perm: Sequence[int], dtype: str, op: str = "permute") -> KernelConfig:
    """The kernel for ``x.permute(perm)`` (``op="permute"``) or for ``x.permute(perm) + y`` where ``perm``
    swaps two dims (``op="transpose_add"``), ``x`` of ``shape`` and ``dtype`` (a jittor dtype name).

    ``shape`` must hold no zero (the callers return an empty tensor without a launch).
    """
    if op not in VARIANTS:
        raise ValueError(f"op must be one of {sorted(VARIANTS)}, got {op!r}")
    dtype = _codegen.dtype_name(dtype)
    plan = plan_permute(shape, perm, _codegen.ITEMSIZE[dtype])
    variant, pack, loose = _choose_variant(plan, op)
    count, rank = plan.count, plan.rank
    params = {"count": count, "rank": rank, "chunk": plan.chunk, "bytes": count * plan.chunk}
    batch_rank, block, grid = 0, (), 0  # copy: cudaMemcpyAsync, no launch geometry
    batch = ()  # the tiled variants' output dims outside the tile plane

    out_dims = plan.out_dims
    in_strides, out_strides = _strides(plan.in_dims), _strides(out_dims)
    if variant in ("general", "add", "tiled_grouped"):  # the grouped variant's CPU path is the N-d walk
        block, grid = (ND_THREADS,), -(-count // (ND_THREADS * ND_UNROLL))
        for k, p in enumerate(plan.perm):
            params[f"d{k}"] = out_dims[k]
            params[f"s{k}"] = in_strides[p]
    if variant == "tiled_grouped":
        group = plan.in_dims[-1]
        a_dim, b_dim = rank - 2, plan.perm[-2]
        a_pos = plan.perm.index(a_dim)
        batch = [k for k in range(rank) if k not in (a_pos, rank - 2, rank - 1)]
        batch_rank = len(batch)
        tiles_a = -(-plan.in_dims[a_dim] // (32 // group))
        tiles_b = -(-plan.in_dims[b_dim] // 32)
        block, grid = (32, TILE_ROWS), tiles_a * tiles_b * math.prod(out_dims[k] for k in batch)
        params.update(A=plan.in_dims[a_dim], B=plan.in_dims[b_dim], isb=in_strides[b_dim],
                      osa=out_strides[a_pos], tiles_a=tiles_a, tiles_b=tiles_b, batch_rank=batch_rank,
                      group=group, b_fast=0)
    elif variant in ("tiled", "tiled_packed"):
        a_dim, b_dims = rank - 1, _tile_b_dims(plan)
        b_dim, b_size = b_dims[-1], math.prod(plan.in_dims[k] for k in b_dims)
        a_pos = plan.perm.index(a_dim)  # output position of the input's last dim
        b_pos = range(rank - len(b_dims), rank)  # output positions of the B side
        batch = [k for k in range(rank) if k != a_pos and k not in b_pos]  # output dims outside the tile plane
        batch_rank = len(batch)
        row_starts = [out_strides[a_pos]] + [out_strides[k] for k in batch]  # steps between output rows
        align = 0 if loose else _align_for(op, plan.chunk, pack, row_starts)
        tiles_a = -(-plan.in_dims[a_dim] // (32 * pack))
        # a shifted row reaches back up to align - pack columns: one more tile may be needed along b
        tiles_b = -(-(b_size + (align - pack if align else 0)) // (32 * pack))
        block, grid = (32, _tile_rows(plan.chunk, pack)), tiles_a * tiles_b * math.prod(out_dims[k] for k in batch)
        params.update(A=plan.in_dims[a_dim], B=b_size, isb=in_strides[b_dim],
                      osa=out_strides[a_pos], tiles_a=tiles_a, tiles_b=tiles_b, batch_rank=batch_rank,
                      b_fast=int(_b_fast()), align=align, split_b=int(len(b_dims) == 2), loose=int(loose))
        if len(b_dims) == 2:  # row b of the plane: input offset (b // bl) * isbh + (b % bl) * isb
            params.update(bl=plan.in_dims[b_dim], isbh=in_strides[b_dims[0]])
    for i, k in enumerate(batch):
        params[f"bd{i}"] = out_dims[k]
        params[f"bi{i}"] = in_strides[plan.perm[k]]
        params[f"bo{i}"] = out_strides[k]
    if variant != "fallback":
        params["grid"] = grid
    return KernelConfig(op=op, variant=variant, dtype=dtype, rank=rank, chunk=plan.chunk, pack=pack,
                        batch_rank=batch_rank, index_type=_codegen.index_type(count), block=block, grid=grid,
                        params=tuple(sorted(params.items())))


# ---- sources: the menus ----------------------------------------------------------------------------------
#
# One translation unit per (op, dtype, index type): its header includes the kernels and a generated menu (a host
# function switching over every instantiation the dispatcher can pick for that element size); the source is one
# line calling the menu with the entry's index from `data["v"]`. Batch rank is a run-time value of the tile
# kernels, so every permute of a dtype, of any rank and shape, shares one compile.

def _entry(cfg: KernelConfig) -> tuple:
    """The menu key of a configuration."""
    v = cfg.variant
    if v == "copy":
        return ("copy",)
    if v in ("general", "add"):
        return ("nd", 1 if v == "add" else cfg.rank, cfg.chunk)
    if v == "tiled_grouped":
        return ("grouped", cfg.chunk, cfg.data["group"])
    d = cfg.data
    return ("tiled", cfg.chunk, cfg.pack, d["align"], d["split_b"], d["loose"])


def _call(op: str, entry: tuple, index_type: str) -> str:
    """The launcher call of a menu entry (pointers in0_p / in1_p / out0_p and jittor's ``data``)."""
    kind, args = entry[0], entry[1:]
    add = op == "transpose_add"
    io = "(in0_p, in1_p, out0_p, data)" if add else "(in0_p, out0_p, data)"
    t = "T, " if add else ""
    if kind == "copy":
        return "ops_permute_copy(in0_p, out0_p, data)"
    if kind == "nd":
        rank, chunk = args
        return f"ops_{op}_nd<{t}{rank}, {chunk}, {index_type}, {ND_THREADS}, {ND_UNROLL}>{io}"
    if kind == "grouped":
        chunk, group = args
        return f"ops_{op}_grouped<{t}{chunk}, {group}, {index_type}, {TILE_ROWS}>{io}"
    chunk, pack, align, split_b, loose = args
    return (f"ops_{op}_tiled<{t}{chunk}, {pack}, {index_type}, {_tile_rows(chunk, pack)}, {align}, {split_b}, "
            f"{loose}>{io}")


def render(cfg: KernelConfig) -> str:
    """The launcher call of ``cfg`` (its menu entry): only code-changing constants appear in the text."""
    if cfg.variant == "fallback":
        raise ValueError("the fallback variant runs jittor's own permute and has no CUDA source")
    return _call(cfg.op, _entry(cfg), cfg.index_type) + ";"


def _aligns(chunk: int, pack: int) -> Tuple[int, ...]:
    """The shifted tile's units (elements per 32- or 64-byte unit) a tile of (chunk, pack) can take, 0 first."""
    units = [u // chunk for u in (32, 64) if u > chunk * pack]
    return (0,) + tuple(u for u in units if u - pack < 32 * pack and u % pack == 0 and (32 * pack) % u == 0)


def _packs(chunk: int) -> Tuple[Tuple[int, bool], ...]:
    """(pack, loose) of the tiles of ``chunk``-byte elements: plain, 4-byte and 8-byte words, loose words."""
    packs = [(1, False)]
    if chunk < 4:
        packs.append((4 // chunk, False))
    if chunk in (2, 4):
        packs.append((8 // chunk, False))
    packs += [(p, True) for p, _ in packs[1:]]
    return tuple(packs)


@functools.lru_cache(maxsize=None)
def menu(op: str, itemsize: int) -> _codegen.Menu:
    """Every instantiation the dispatcher can pick for ``op`` on elements of ``itemsize`` bytes."""
    chunks = [c for c in CHUNKS if c >= itemsize and c % itemsize == 0]
    entries = [] if op == "transpose_add" else [("copy",)]
    entries += [("nd", rank, c) for c in chunks for rank in range(1, MAX_RANK + 1)]
    entries += [("grouped", c, g) for c in chunks for g in GROUPS]
    for c in chunks:
        for pack, loose in _packs(c):
            for align in ((0,) if loose else _aligns(c, pack)):
                entries += [("tiled", c, pack, align, split_b, int(loose)) for split_b in (0, 1)]
    return _codegen.Menu(entries, lambda e: _call(op, e, "I"))


@functools.lru_cache(maxsize=None)
def cuda_header(op: str, itemsize: int) -> str:
    """``cuda_header`` of every ``op`` launch on elements of ``itemsize`` bytes: the kernels and the menu."""
    head = (f"template <typename T, typename I, class Map>\nvoid ops_{op}_menu(int v, const T* in0_p, "
            + ("const T* in1_p, " if op == "transpose_add" else "") + "T* out0_p, Map& data)")
    text = (f"// ops: {op} menu for {itemsize}-byte elements (generated by ops/permutation.py)\n#pragma once\n"
            + menu(op, itemsize).render(head, op))
    return _codegen.include(("common", "permute"), (_codegen.generated(f"{op}_menu_{itemsize}", text),))


_CUDA_SRC = {
    "permute": "ops_permute_menu<in0_type, {I}>((int)data[\"v\"], in0_p, out0_p, data);",
    "transpose_add": "ops_transpose_add_menu<in0_type, {I}>((int)data[\"v\"], in0_p, in1_p, out0_p, data);",
}
# The CPU sources: names permute_cpu.h defines (a short source keys and copies faster). The gradients are jt.code
# grad sources (jittor builds the backward op itself: no Python per backward): dx is the inverse permute of dout,
# planned under '_' keys; transpose_add's dy is dout.
_CPU_SRC = {"permute": "OPS_PERMUTE_FWD;", "transpose_add": "OPS_TRANSPOSE_ADD_FWD;"}
_CPU_GRAD_SRC = "OPS_PERMUTE_GRAD;"
_CPU_COPY_GRAD_SRC = "OPS_COPY_GRAD;"
# The one-letter fields of the CPU plan's dims (permute_cpu.h): sizes, input strides, output strides.
_CPU_DIM_KEYS = ("A", "I", "Q")


def cpu_plan_data(shape: Sequence[int], perm: Sequence[int]) -> Dict[str, int]:
    """The CPU path's plan of ``x.permute(perm)`` for ``x`` of ``shape`` (no zero), in elements, as ``data``
    (see ``cuda_snippets/permute_cpu.h``): the identity (mode 0), rows that stay whole (mode 1: the last dim
    stays; the outer output dims with their input strides), or tiles of the plane of the input's last dim (A)
    and the output's last dim (B) for every index of the other output dims (mode 2)."""
    dims, p = simplify_permutation(shape, perm)
    rank = len(dims)
    if rank == 1:
        return {"m": 0}
    in_strides, out_dims = _strides(dims), tuple(dims[k] for k in p)
    out_strides = _strides(out_dims)
    if p[-1] == rank - 1:  # rows: output dims 0 .. rank - 2 walk whole input rows
        outer = range(rank - 1)
        data = {"m": 1, "r": dims[-1], "k": rank - 1}
    else:
        a_pos = p.index(rank - 1)  # where the input's last dim lands in the output
        outer = [k for k in range(rank - 1) if k != a_pos]
        data = {"m": 2, "a": dims[-1], "b": dims[p[-1]], "i": in_strides[p[-1]], "o": out_strides[a_pos],
                "k": len(outer)}
    for n, k in enumerate(outer):
        size, in_key, out_key = (chr(ord(c) + n) for c in _CPU_DIM_KEYS)
        data[size], data[in_key] = out_dims[k], in_strides[p[k]]
        if data["m"] == 2:
            data[out_key] = out_strides[k]
    return data


def launch(cfg: KernelConfig, cuda: bool, shape: Sequence[int] = (), perm: Sequence[int] = (),
           need_grad: bool = True) -> _launch.Launch:
    """The ``jt.code`` launch of ``cfg``: flat input(s) to a flat output (one compile for every rank). The CPU
    path plans from the call's ``shape`` and ``perm`` (:func:`cpu_plan_data`), carries its gradients as grad
    sources when a backward may follow (see :func:`cpu_grads`; without them a (5,6,7,8) call builds in 2.6
    instead of 3.2 us: 6 data entries and the grad source less) and takes the inputs as they are to the
    output's shape (one compile per rank: the two reshapes around a flat launch cost ~4 us of a (64,64) call's
    ~17 on the 2-core CPU machine, 2026-11-25); the GPU plans from ``cfg``."""
    numel = cfg.data["bytes"] // _codegen.ITEMSIZE[cfg.dtype]
    grad_srcs, out_shape = None, (numel,)
    if cuda:
        data = cfg.data
        data["v"] = menu(cfg.op, _codegen.ITEMSIZE[cfg.dtype]).index(_entry(cfg))
        src = _CUDA_SRC[cfg.op].format(I=cfg.index_type)
        header = cuda_header(cfg.op, _codegen.ITEMSIZE[cfg.dtype])
    else:
        data = _launch.pack_fields(cpu_plan_data(shape, perm))
        src, header = _CPU_SRC[cfg.op], _codegen.cpu_include("permute_cpu.h")
        if shape:
            if need_grad:
                grad_data, grad_srcs = cpu_grads(cfg.op, shape, perm)
                data.update(grad_data)
            if len(shape) <= _launch.CODE_MAX_RANK:
                out_shape = tuple(shape[p] for p in perm)
    return _launch.Launch(out_shape, cfg.dtype, cuda=cuda, src=src, header=header, data=data, grad_srcs=grad_srcs)


def cpu_grads(op: str, shape: Sequence[int], perm: Sequence[int]):
    """The CPU backward of ``op`` on ``x`` of ``shape``: the ``data`` of dx's plan (the inverse permute of dout,
    its fields packed under the prefix '_') and the grad sources, one per input."""
    out_shape = tuple(shape[p] for p in perm)
    inverse = perm if op == "transpose_add" else _inverse(perm)  # transpose_add's swap is its own inverse
    grad_data = _launch.pack_fields(cpu_plan_data(out_shape, inverse), "_")
    srcs = [_CPU_GRAD_SRC] + ([_CPU_COPY_GRAD_SRC] if op == "transpose_add" else [])
    return grad_data, srcs


def run_config(cfg: KernelConfig, inputs: Sequence) -> "jt.Var":
    """Run ``cfg`` on ``inputs`` (x, and y for transpose_add) on the GPU; returns the flat output."""
    numel = cfg.data["bytes"] // _codegen.ITEMSIZE[cfg.dtype]
    return launch(cfg, True)([_reshape(v, (numel,)) for v in inputs])


# ---- plans: one per call signature ------------------------------------------------------------------------


class _Plan:
    """A permute (or transpose_add) of one signature: the flat launch between two reshapes (on the CPU, the
    launch on the inputs as they are, to the output's shape). dx is the inverse permute of dy (a swap is its own
    inverse), dy of transpose_add's y is dy itself: on the CPU the launch carries them as grad sources; on the
    GPU the launch is recorded for autograd (``_launch.taped``) when a backward may follow. No atomics:
    gradients are bit-for-bit deterministic."""

    __slots__ = ("launch", "numel", "out_shape", "inputs", "need_grad", "inverse_key", "cpu", "shaped", "_backward")

    def __init__(self, launch, numel, out_shape, inputs, need_grad, inverse_key):
        self.launch, self.numel, self.out_shape, self.inputs = launch, numel, out_shape, inputs
        self.need_grad, self.inverse_key, self._backward = need_grad, inverse_key, None
        self.cpu = not inverse_key[-1]
        self.shaped = launch.shapes == tuple(out_shape)  # the launch takes and gives the Vars as they are

    def forward(self, inputs):
        if self.shaped:
            return self.launch(list(inputs))
        n = (self.numel,)
        return _reshape(self.launch([_reshape(v, n) for v in inputs]), self.out_shape)

    def backward_plan(self):
        """The plan of permute(dy, inverse perm), made on the first backward."""
        if self._backward is None:
            shape, dtype, perm, cuda = self.inverse_key
            self._backward = _permute_plan(shape, dtype, perm, False, cuda)
        return self._backward

    def grad(self, dout):
        dx = self.backward_plan()(dout)
        return (dx, dout) if self.inputs == 2 else (dx,)

    def __call__(self, *inputs):
        if self.need_grad and not self.cpu:  # the CPU launch carries its gradients as grad sources
            return _launch.taped(inputs, self.forward, self.grad)
        return self.forward(inputs)


class _FixedPlan:
    """A call that launches nothing of ours: an empty tensor, or jittor's own permute (``fallback``)."""

    __slots__ = ("out_shape", "dtype", "perm")

    def __init__(self, out_shape, dtype, perm=None):
        self.out_shape, self.dtype, self.perm = out_shape, dtype, perm

    def __call__(self, x, *_):
        if self.perm is not None:
            return x.permute(*self.perm)
        return jt.zeros(self.out_shape, self.dtype)


def _inverse(perm: Sequence[int]) -> Tuple[int, ...]:
    inverse = [0] * len(perm)
    for k, p in enumerate(perm):
        inverse[p] = k
    return tuple(inverse)


def _fastest(plan: _Plan):
    """``plan``, or its launch bound as a function where the call is that launch alone (a CPU plan: the Vars as
    they are, gradients as grad sources): a (5,6,7,8) permute then builds in ~1.0 instead of ~1.8 us on the
    2-core CPU machine."""
    return plan.launch.bind(plan.inputs) if plan.cpu and plan.shaped else plan


def _plan(op: str, shape: Tuple[int, ...], dtype: str, perm: Tuple[int, ...], need_grad: bool, cuda: bool):
    """The plan of ``op`` ('permute' or 'transpose_add') on ``x`` of ``shape`` (checked) and ``perm``."""
    out_shape = tuple(shape[p] for p in perm)
    if math.prod(shape) == 0:
        return _FixedPlan(out_shape, dtype)
    cfg = select_config(shape, perm, dtype, op)
    if cfg.variant == "fallback":  # a permute only: a swap of two dims simplifies to at most 5 dims
        return _FixedPlan(out_shape, dtype, perm)
    inputs, inverse = (1, _inverse(perm)) if op == "permute" else (2, perm)  # a swap is its own inverse
    return _fastest(_Plan(launch(cfg, cuda, shape, perm, need_grad), cfg.data["bytes"] // _codegen.ITEMSIZE[dtype],
                          out_shape, inputs, need_grad, (out_shape, dtype, inverse, cuda)))


_permute_plan = functools.partial(_plan, "permute")
_transpose_add_plan = functools.partial(_plan, "transpose_add")

# Each entry point checks its recent calls first (PlanCache.planned).
_PERMUTE_PLANS = _launch.PlanCache("permute")
_TRANSPOSE_PLANS = _launch.PlanCache("transpose")
_TRANSPOSE_ADD_PLANS = _launch.PlanCache("transpose_add")


# ---- functional API ---------------------------------------------------------------------------------------


def _check_dim(ndim: int, d, name: str) -> int:
    d = as_index(d, name)
    if not -ndim <= d < ndim:
        raise ValueError(f"{name}={d} is out of range for a tensor of {ndim} dims")
    return d % ndim


def _dims_arg(dims, ndim=None) -> tuple:
    """permute's ``*dims`` as a tuple of ints: varargs, or one sequence (tuple, list, range, 1-D NumPy array,
    jittor's NanoVector, ...), as NumPy, PyTorch and jittor take them; none at all (or one None, NumPy's
    ``axes=None``) reverses the dims of a tensor of ``ndim`` dims."""
    if len(dims) == 1:
        if dims[0] is None:
            dims = ()
        elif is_sequence(dims[0]):
            return as_index_sequence(dims[0], "dims")
    if not dims and ndim is not None:
        return tuple(range(ndim - 1, -1, -1))
    return tuple(as_index(d, f"dims[{i}]") for i, d in enumerate(dims))


def _permute_plan_of(x, dims, need_grad: bool):
    """The plan of ``permute(x, *dims)``, after checking its dims."""
    perm = normalize_dims(x.ndim, _dims_arg(dims, x.ndim), "dims")
    return _permute_plan(tuple(x.shape), str(x.dtype), perm, need_grad, _launch.on_cuda())


def _transpose_plan_of(x, dims: tuple, need_grad: bool):
    """The plan of ``transpose(x, dim0, dim1)``, after checking its dims: two dims swap (PyTorch); one sequence of
    dims permutes, none reverses (NumPy's and jittor's ``transpose``)."""
    dim0, dim1 = dims
    if dim1 is None:
        if dim0 is not None and not is_sequence(dim0):
            raise TypeError(f"transpose takes two dims to swap (dim0, dim1) or one sequence of dims, got dim0={dim0!r} "
                            f"and no dim1")
        return _permute_plan_of(x, (dim0,), need_grad)
    perm = _swap(x.ndim, _check_dim(x.ndim, dim0, "dim0"), _check_dim(x.ndim, dim1, "dim1"))
    return _permute_plan(tuple(x.shape), str(x.dtype), perm, need_grad, _launch.on_cuda())


_open_permute = opening1(_PERMUTE_PLANS, _permute_plan_of)
_open_transpose = opening1(_TRANSPOSE_PLANS, _transpose_plan_of)


def permute(x, *dims):
    """``x`` with its dims reordered: output dim k is input dim ``dims[k]`` (NumPy's ``transpose(x, dims)``).

    ``dims`` as varargs (``permute(x, 2, 0, 1)``, PyTorch's ``x.permute(2, 0, 1)``) or one sequence (tuple,
    list, range, NumPy array); ints in any form (NumPy integers too); negative dims count from the end; no dims
    reverse them (NumPy's and jittor's ``transpose(x)``). Any dtype, rank and size (an empty ``x`` gives an empty
    result). TypeError/ValueError naming ``dims`` on a bad permutation.
    """
    return _open_permute(x, dims)


def transpose(x, dim0=None, dim1=None):
    """``x`` with dims ``dim0`` and ``dim1`` swapped (PyTorch's ``transpose``); given one sequence of dims,
    ``permute(x, dims)``, and given none, the dims reversed (NumPy's and jittor's ``transpose``)."""
    return _open_transpose(x, (dim0, dim1))


def _swap(ndim: int, dim0: int, dim1: int) -> Tuple[int, ...]:
    perm = list(range(ndim))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return tuple(perm)


def _transpose_add_plan_of(x, y, dims: tuple, need_grad: bool):
    """The plan of ``transpose_add(x, y, dim0, dim1)``, after checking its arguments."""
    dim0, dim1 = dims
    d0 = _check_dim(x.ndim, dim0, "dim0")
    d1 = _check_dim(x.ndim, dim1, "dim1")
    if str(y.dtype) != str(x.dtype):
        raise TypeError(f"y must have x's dtype {x.dtype}, got {y.dtype}")
    perm = _swap(x.ndim, d0, d1)
    want = tuple(x.shape[p] for p in perm)
    if tuple(y.shape) != want:
        raise ValueError(f"y must have the transposed shape {list(want)} of x {list(x.shape)} "
                         f"(dims {d0} and {d1} swapped), got {list(y.shape)}")
    return _transpose_add_plan(tuple(x.shape), str(x.dtype), perm, need_grad, _launch.on_cuda())


_open_transpose_add = opening2(_TRANSPOSE_ADD_PLANS, _transpose_add_plan_of)


def transpose_add(x, y, dim0=0, dim1=1):
    """``x.transpose(dim0, dim1) + y`` in one pass. ``y`` has exactly the transposed shape and x's dtype.

    float16/bfloat16 are added in float32 and rounded once; integers wrap; bool adds as logical or.
    """
    return _open_transpose_add(x, y, (dim0, dim1))


class Permute(jt.Module):
    """Layer of :func:`permute`: ``Permute(2, 0, 1)``, ``Permute((2, 0, 1))`` or ``Permute(dims=[2, 0, 1])``
    (torchvision's ``Permute``); no dims reverse them. The dims are checked here: they must be a permutation
    of as many dims as they list (negative dims counted from the end)."""

    def __init__(self, *args, dims=None):
        super().__init__()
        if dims is not None:
            if args:
                raise TypeError("Permute takes its dims as arguments or as dims=, not both")
            args = (dims,)
        given = _dims_arg(args)
        if given:
            normalize_dims(len(given), given, "dims")
        self.dims = given

    def execute(self, x):
        """``permute(x, *self.dims)``: x of as many dims as the layer lists (any number when it lists none)."""
        return permute(x, *self.dims)

    forward = execute

    def extra_repr(self) -> str:
        return f"dims={self.dims}"


class TransposeAdd(jt.Module):
    """Layer of :func:`transpose_add`: ``TransposeAdd(dim0, dim1)(x, y) == transpose_add(x, y, dim0, dim1)``."""

    def __init__(self, dim0=0, dim1=1):
        super().__init__()
        self.dim0 = as_index(dim0, "dim0")
        self.dim1 = as_index(dim1, "dim1")

    def execute(self, x, y):
        """``x.transpose(dim0, dim1) + y`` in one pass; ``y`` has the transposed shape and x's dtype."""
        return transpose_add(x, y, self.dim0, self.dim1)

    forward = execute

    def extra_repr(self) -> str:
        return f"dim0={self.dim0}, dim1={self.dim1}"
