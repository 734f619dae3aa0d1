"""permute / transpose / transpose_add: shape algebra, dispatch, an emulation of the CUDA kernels' index math,
values for every dtype (CPU; GPU under -m cuda), gradients, errors, the case table and an nvcc compile."""
import dataclasses
import math

import numpy as np
import pytest

import ops
from ops._jittor import jt
from ops.scoring.spec import random_array, round_to_bfloat16

from ops import permutation as P  # noqa: E402
from ops import _codegen  # noqa: E402
from ops.scoring import fam_permute  # noqa: E402

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "float16", "bfloat16", "float32",
          "float64"]


def to_var(a: np.ndarray, dtype: str):
    if dtype in ("float64", "int64"):  # jt.array alone narrows 64-bit arrays to 32 bits
        return jt.array(a, dtype=dtype)
    v = jt.array(a)
    return v if str(v.dtype) == dtype else v.astype(dtype)


def to_np(v) -> np.ndarray:
    return (v.float32() if str(v.dtype) == "bfloat16" else v).numpy()


def swapped(shape, d0, d1):
    s = list(shape)
    s[d0], s[d1] = s[d1], s[d0]
    return tuple(s)


def add_reference(x, y, d0, d1, dtype):
    """float64 sum rounded once to ``dtype`` (ints wrap in their dtype, bool is or)."""
    xt = np.swapaxes(x, d0, d1)
    if dtype == "bool" or not dtype.startswith(("float", "bfloat")):
        return xt + y
    s = xt.astype(np.float64) + y.astype(np.float64)
    if dtype == "bfloat16":
        return round_to_bfloat16(s.astype(np.float32))
    return s.astype(dtype)


def assert_close_add(got, want, dtype):
    if dtype in ("float16", "bfloat16"):
        # the kernels add in float32 and round once; the float64 sum rounded once may differ by one ulp
        ulp = 2.0 ** (-10 if dtype == "float16" else -7)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=ulp, atol=ulp * 2**-14)
    else:
        np.testing.assert_array_equal(got, want)


# ---- shape algebra ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("ndim, dims, want", [
    (3, (2, 0, 1), (2, 0, 1)), (3, (-1, 0, -2), (2, 0, 1)), (1, (0,), (0,)), (2, [1, 0], (1, 0)),
    (2, (np.int64(1), 0), (1, 0)),
])
def test_normalize_dims(ndim, dims, want):
    assert P.normalize_dims(ndim, dims) == want


@pytest.mark.parametrize("shape, perm, dims, new_perm", [
    ((5, 6, 7, 8), (2, 3, 0, 1), (30, 56), (1, 0)),          # OneFlow's example
    ((3, 4, 5), (0, 2, 1), (3, 4, 5), (0, 2, 1)),
    ((2, 3, 4, 5), (0, 1, 3, 2), (6, 4, 5), (0, 2, 1)),
    ((2, 3, 4, 5), (1, 0, 2, 3), (2, 3, 20), (1, 0, 2)),
    ((2, 3, 4, 5), (0, 1, 2, 3), (120,), (0,)),               # identity
    ((33, 1, 65), (2, 1, 0), (33, 65), (1, 0)),               # size-1 dims dropped
    ((1, 7, 1), (2, 0, 1), (7,), (0,)),
    ((1, 1), (1, 0), (1,), (0,)),
    ((6, 1, 4, 1, 5), (4, 3, 2, 1, 0), (6, 4, 5), (2, 1, 0)),
    ((2, 3, 4, 5, 6), (3, 4, 0, 1, 2), (24, 30), (1, 0)),
    ((16, 32, 16, 32, 32), (0, 4, 2, 1, 3), (16, 32, 16, 32, 32), (0, 4, 2, 1, 3)),
])
def test_simplify_permutation(shape, perm, dims, new_perm):
    assert P.simplify_permutation(shape, perm) == (dims, new_perm)


@pytest.mark.parametrize("nbytes, want", [(64, 16), (24, 8), (12, 4), (6, 2), (3, 1), (4096, 16), (1, 1)])
def test_movement_size(nbytes, want):
    assert P.movement_size(nbytes) == want


@pytest.mark.parametrize("shape, perm, itemsize, dims, new_perm, chunk", [
    ((2048, 1024, 16), (1, 0, 2), 4, (2048, 1024, 4), (1, 0, 2), 16),  # 64-byte rows in 16-byte chunks
    ((1024, 1024, 4), (1, 0, 2), 4, (1024, 1024), (1, 0), 16),        # a 16-byte last dim disappears
    ((10, 20, 3), (1, 0, 2), 4, (10, 20, 3), (1, 0, 2), 4),            # 12 bytes: 4-byte chunks
    ((10, 20, 2), (1, 0, 2), 1, (10, 20), (1, 0), 2),                  # bool pairs move as 2 bytes
    ((32, 512, 16, 64), (0, 2, 1, 3), 2, (32, 512, 16, 8), (0, 2, 1, 3), 16),
    ((4097, 3071), (1, 0), 4, (4097, 3071), (1, 0), 4),                # last dim moves: element size
    ((7, 5), (0, 1), 2, (35,), (0,), 2),                               # identity of 70 bytes
    ((8, 8), (0, 1), 4, (16,), (0,), 16),
])
def test_plan_permute(shape, perm, itemsize, dims, new_perm, chunk):
    plan = P.plan_permute(shape, perm, itemsize)
    assert (plan.in_dims, plan.perm, plan.chunk) == (dims, new_perm, chunk)
    assert plan.count * plan.chunk == math.prod(shape) * itemsize


# ---- dispatch table ---------------------------------------------------------------------------------------

# (shape, perm, dtype, op) -> (variant, pack, chunk bytes)
SELECT_TABLE = [
    ((3, 4), (0, 1), "float32", "permute", ("copy", 1, 16)),
    ((1, 9), (1, 0), "float16", "permute", ("copy", 1, 2)),
    ((2048, 1024, 16), (1, 0, 2), "float32", "permute", ("tiled_grouped", 1, 16)),   # 4-chunk groups
    ((32, 512, 16, 64), (0, 2, 1, 3), "float16", "permute", ("tiled_grouped", 1, 16)),  # 8-chunk groups
    ((1024, 512, 8), (1, 0, 2), "float32", "permute", ("tiled_grouped", 1, 16)),        # 2-chunk groups
    ((2048, 1024, 12), (1, 0, 2), "float32", "permute", ("general", 1, 16)),            # 3 chunks: no group
    ((2048, 1024, 64), (1, 0, 2), "float32", "permute", ("general", 1, 16)),            # 256-byte runs
    ((2048, 3, 16), (1, 0, 2), "float32", "permute", ("general", 1, 16)),               # a below 32 / G
    ((10, 20, 3), (1, 0, 2), "float32", "permute", ("general", 1, 4)),
    ((64, 8, 100), (0, 2, 1), "float32", "permute", ("general", 1, 4)),          # a tile dim below 16
    ((8, 24, 40, 16, 64), (3, 1, 4, 2, 0), "float16", "permute", ("tiled_packed", 2, 2)),  # split B: 40 x 8
    ((8, 24, 40, 16, 64), (3, 1, 4, 2, 0), "float32", "permute", ("tiled_packed", 2, 4)),
    ((2, 3, 64), (2, 1, 0), "float32", "permute", ("general", 1, 4)),            # split B 3 x 2: still below 16
    ((8, 40, 64), (2, 1, 0), "float32", "transpose_add", ("tiled_packed", 2, 4)),  # split B: 40 x 8
    ((32, 1024, 1024), (0, 2, 1), "float32", "permute", ("tiled_packed", 2, 4)),  # 8-byte words of 2 floats
    ((4097, 3071), (1, 0), "float32", "permute", ("tiled", 1, 4)),               # odd: no pairs
    ((4097, 3071), (1, 0), "float16", "permute", ("tiled", 1, 2)),
    ((64, 64, 128, 128), (2, 3, 0, 1), "float32", "permute", ("tiled_packed", 2, 4)),
    ((16, 32, 16, 32, 32), (0, 4, 2, 1, 3), "float32", "permute", ("tiled", 1, 4)),  # 32 < a 64-float edge
    ((100, 62), (1, 0), "float32", "permute", ("tiled", 1, 4)),                  # 62 < 64
    ((4096, 4096), (1, 0), "int64", "permute", ("tiled", 1, 8)),
    ((1024, 1024, 4), (1, 0, 2), "float32", "permute", ("tiled", 1, 16)),
    ((32, 1024, 1024), (0, 2, 1), "float16", "permute", ("tiled_packed", 2, 2)),   # 2 KB rows, 128 MB
    ((32, 1024, 1024), (0, 2, 1), "bfloat16", "permute", ("tiled_packed", 2, 2)),
    ((4096, 4096), (1, 0), "float16", "permute", ("tiled_packed", 2, 2)),          # 8 KB rows, 64 MB
    ((8192, 8192), (1, 0), "float16", "permute", ("tiled_packed", 4, 2)),          # 16 KB rows
    ((32, 512, 512), (0, 2, 1), "float16", "permute", ("tiled_packed", 4, 2)),     # 32 MB touched (L2)
    ((16, 512, 512), (0, 2, 1), "float16", "transpose_add", ("tiled_packed", 4, 2)),  # 24 MB touched
    ((32, 512, 512), (0, 2, 1), "float16", "transpose_add", ("tiled_packed", 2, 2)),  # 48 MB touched
    ((24, 8192, 60), (0, 2, 1), "float16", "permute", ("tiled_packed", 2, 2)),     # 60 < a 128-half edge
    ((64, 1024, 1024), (0, 2, 1), "int8", "permute", ("tiled_packed", 4, 1)),
    ((32, 1024, 1024), (0, 2, 1), "bool", "permute", ("tiled_packed", 4, 1)),
    ((30, 30), (1, 0), "float16", "permute", ("tiled", 1, 2)),                   # too small to fill pairs
    ((100, 60), (1, 0), "int8", "permute", ("tiled", 1, 1)),                     # 60 % 4 == 0, but < 64
    ((2,) * 9, tuple(range(8, -1, -1)), "float32", "permute", ("fallback", 1, 4)),
    ((4, 5), (0, 1), "float32", "transpose_add", ("add", 1, 16)),
    ((1, 7), (1, 0), "float32", "transpose_add", ("add", 1, 4)),
    ((6, 5, 4), (1, 0, 2), "float32", "transpose_add", ("general", 1, 16)),
    ((6, 5, 3), (1, 0, 2), "float16", "transpose_add", ("general", 1, 2)),
    ((40, 33, 8), (1, 0, 2), "float32", "transpose_add", ("tiled_grouped", 1, 16)),
    ((100, 8), (1, 0), "float32", "transpose_add", ("general", 1, 4)),
    ((8192, 8192), (1, 0), "float32", "transpose_add", ("tiled_packed", 2, 4)),
    ((4097, 3071), (1, 0), "float16", "transpose_add", ("tiled", 1, 2)),
    ((16, 1024, 1024), (0, 2, 1), "float32", "transpose_add", ("tiled_packed", 2, 4)),
    ((16, 1024, 62), (0, 2, 1), "float32", "transpose_add", ("tiled", 1, 4)),
    ((24300, 11520), (1, 0), "bfloat16", "transpose_add", ("tiled_packed", 4, 2)),
    ((32, 1024, 1024), (0, 2, 1), "float16", "transpose_add", ("tiled_packed", 2, 2)),
    ((512, 256), (1, 0), "int8", "transpose_add", ("tiled_packed", 4, 1)),
]


@pytest.mark.parametrize("shape, perm, dtype, op, want", SELECT_TABLE)
def test_select_config_table(shape, perm, dtype, op, want):
    cfg = P.select_config(shape, perm, dtype, op)
    assert (cfg.variant, cfg.pack, cfg.chunk) == want
    assert cfg.index_type == "int"
    assert cfg.dtype == dtype


def test_every_variant_is_selected():
    seen = {(op, P.select_config(s, p, d, op).variant) for s, p, d, op, _ in SELECT_TABLE}
    want = {(op, v) for op, vs in P.VARIANTS.items() for v in vs}
    assert seen == want
    packs = {P.select_config(s, p, d, op).pack for s, p, d, op, _ in SELECT_TABLE}
    assert packs == {1, 2, 4}


def test_index_type_by_count():
    # 2^31 int8 elements: long long; (no allocation: select_config is pure Python)
    big = P.select_config((2**16, 2**15 + 4), (1, 0), "int8")
    assert big.index_type == "long long" and big.variant == "tiled_packed"
    edge = P.select_config((2**16, 2**15 - 1), (1, 0), "int8")
    assert edge.index_type == "int"
    # counted in moved chunks: 2^32 bytes moved as 16-byte chunks is 2^28 chunks: int
    chunked = P.select_config((2**16, 2**12, 16), (1, 0, 2), "int8")
    assert chunked.index_type == "int" and chunked.chunk == 16


def test_tiled_geometry():
    cfg = P.select_config((3, 70, 37), (0, 2, 1), "float32")
    d = cfg.data
    got = (cfg.batch_rank, cfg.block, d["A"], d["B"], d["tiles_a"], d["tiles_b"])
    assert got == (1, (32, 4), 37, 70, 2, 3)  # 32-wide tile of 4-byte elements: 4 rows of threads
    assert cfg.grid == 3 * 2 * 3 and d["isb"] == 37 and d["osa"] == 70 and (d["bd0"], d["bi0"], d["bo0"]) == (
        3, 70 * 37, 70 * 37)
    packed = P.select_config((2, 64, 128), (0, 2, 1), "float16")
    assert packed.pack == 2 and packed.grid == 2 * 2 * 1  # 64-element tiles
    # split B: the output's last two dims (input dims 2 and 0: 40 x 8) are the plane's B side
    split = P.select_config((8, 24, 40, 16, 64), (3, 1, 4, 2, 0), "float16")
    d = split.data
    assert (d["split_b"], d["A"], d["B"], d["bl"], d["isb"], d["isbh"], d["osa"]) == (
        1, 64, 320, 8, 24 * 40 * 16 * 64, 16 * 64, 320)
    assert split.batch_rank == 2 and (d["bd0"], d["bd1"]) == (16, 24) and split.grid == 1 * 5 * 16 * 24


def test_tile_rows_rule():
    """Thread rows of the tiled kernel: 8 words per thread and phase (the tile edge / 8), 1-byte quads and the
    grouped tile 8 rows (H100 A/B of 4 / 8 / 16 rows in ops/permutation.py)."""
    def block(shape, perm, dtype, op="permute"):
        cfg = P.select_config(shape, perm, dtype, op)
        return cfg.variant, cfg.pack, cfg.block
    assert block((4097, 3071), (1, 0), "float16") == ("tiled", 1, (32, 4))
    assert block((4097, 3071), (1, 0), "float16", "transpose_add") == ("tiled", 1, (32, 4))
    assert block((16, 32, 16, 32, 32), (0, 4, 2, 1, 3), "float32") == ("tiled", 1, (32, 4))
    assert block((4096, 4096), (1, 0), "int64") == ("tiled", 1, (32, 4))
    assert block((32, 1024, 1024), (0, 2, 1), "float16") == ("tiled_packed", 2, (32, 8))
    assert block((32, 1024, 1024), (0, 2, 1), "float32") == ("tiled_packed", 2, (32, 8))
    assert block((24300, 11520), (1, 0), "bfloat16", "transpose_add") == ("tiled_packed", 4, (32, 16))
    assert block((32, 1024, 1024), (0, 2, 1), "bool") == ("tiled_packed", 4, (32, 8))
    assert block((32, 512, 16, 64), (0, 2, 1, 3), "float16") == ("tiled_grouped", 1, (32, 8))
    for e, pk in [(2, 1), (4, 1), (8, 1), (16, 1), (2, 2), (4, 2), (2, 4)]:
        assert 32 * pk // P._tile_rows(e, pk) == P.TILE_WORDS_PER_THREAD and 32 % P._tile_rows(e, pk) == 0


def test_render_depends_only_on_code_constants():
    a = P.select_config((32, 1024, 1024), (0, 2, 1), "float64")
    b = P.select_config((3, 72, 37), (0, 2, 1), "float64")  # output rows of 72 * 8 bytes: whole sectors
    assert a.params != b.params and P.render(a) == P.render(b)
    assert P.render(a) == "ops_permute_tiled<8, 1, int, 4, 0, 0, 0>(in0_p, out0_p, data);"
    shifted = P.select_config((3, 70, 37), (0, 2, 1), "float64")  # rows of 560 bytes: 64-byte units
    assert P.render(shifted) == "ops_permute_tiled<8, 1, int, 4, 8, 0, 0>(in0_p, out0_p, data);"
    split = P.select_config((8, 24, 40, 16, 64), (3, 1, 4, 2, 0), "float16")
    assert P.render(split) == "ops_permute_tiled<2, 2, int, 8, 0, 1, 0>(in0_p, out0_p, data);"
    g = P.select_config((2048, 1024, 12), (1, 0, 2), "float32")
    assert P.render(g) == "ops_permute_nd<3, 16, int, 256, 4>(in0_p, out0_p, data);"
    grouped = P.select_config((2048, 1024, 16), (1, 0, 2), "float16")
    assert P.render(grouped) == "ops_permute_grouped<16, 2, int, 8>(in0_p, out0_p, data);"
    t = P.select_config((24300, 11520), (1, 0), "bfloat16", "transpose_add")
    assert P.render(t) == "ops_transpose_add_tiled<T, 2, 4, int, 16, 0, 0, 0>(in0_p, in1_p, out0_p, data);"
    s = P.select_config((4, 5), (0, 1), "float32", "transpose_add")
    assert P.render(s) == "ops_transpose_add_nd<T, 1, 16, int, 256, 4>(in0_p, in1_p, out0_p, data);"
    assert P.render(P.select_config((3, 4), (0, 1), "int8")) == "ops_permute_copy(in0_p, out0_p, data);"
    with pytest.raises(ValueError, match="fallback"):
        P.render(P.select_config((2,) * 9, tuple(range(8, -1, -1)), "float32"))


def test_select_config_rejects_unknown_op():
    with pytest.raises(ValueError, match="op"):
        P.select_config((2, 3), (1, 0), "float32", "transpose_mul")


# ---- emulation of the CUDA kernels (pure NumPy, the data the kernels receive) ------------------------------

def _divisor(d):
    """common.cuh's ops_make_divisor + OpsDivisor::div, in Python."""
    shift = 0
    while (1 << shift) < d:
        shift += 1
    magic = (((1 << 32) * ((1 << shift) - d)) // d + 1) & 0xFFFFFFFF
    return lambda n: (((n * magic) >> 32) + n) >> shift


def emulate_nd(cfg, src):
    """ops_permute_nd_kernel on moved elements ``src`` (1-D array): every block, thread and unroll step."""
    d = cfg.data
    rank = 1 if cfg.variant == "add" else cfg.rank
    dims = [d[f"d{k}"] for k in range(rank)]
    divs = [_divisor(x) for x in dims]
    strides = [d[f"s{k}"] for k in range(rank)]
    count, per_block = d["count"], P.ND_THREADS * P.ND_UNROLL
    dst = np.empty(count, dtype=src.dtype)
    written = np.zeros(count, dtype=int)
    assert d["grid"] == -(-count // per_block)
    for blk in range(d["grid"]):
        base = blk * per_block
        rem = count - base
        for u in range(P.ND_UNROLL):
            for t in range(P.ND_THREADS):
                j = t + u * P.ND_THREADS
                if j >= rem:
                    continue
                i, off = base + j, 0
                for k in range(rank - 1, 0, -1):
                    q = divs[k](i)
                    assert q == i // dims[k]
                    off += (i - q * dims[k]) * strides[k]
                    i = q
                off += i * strides[0]
                dst[base + j] = src[off]
                written[base + j] += 1
    assert (written == 1).all()
    return dst


def _tile_block(d, br, blk):
    """A tile kernel's block index -> (tile a, tile b, input and output offsets of its batch index)."""
    t = blk
    if d["b_fast"]:
        tb, t = t % d["tiles_b"], t // d["tiles_b"]
        ta, t = t % d["tiles_a"], t // d["tiles_a"]
    else:
        ta, t = t % d["tiles_a"], t // d["tiles_a"]
        tb, t = t % d["tiles_b"], t // d["tiles_b"]
    sb = db = 0
    for k in range(br - 1, -1, -1):
        c, t = t % d[f"bd{k}"], t // d[f"bd{k}"]
        sb += c * d[f"bi{k}"]
        db += c * d[f"bo{k}"]
    assert t == 0
    return ta, tb, sb, db


def emulate_grouped(cfg, src):
    """ops_group_tile_kernel on moved elements ``src``: every block and thread; also checks that each warp's
    phase-2 shared-memory reads of 16-byte chunks are bank-conflict-free (per quarter warp) and that a warp's
    32 output chunks share one output row."""
    d, rows, C = cfg.data, cfg.block[1], cfg.chunk
    G = d["group"]
    TA, TB, K, pitch = 32 // G, 32, 32 // rows, 32 + G
    A, B, isb, osa = d["A"], d["B"], d["isb"], d["osa"]
    count, br = d["count"], cfg.batch_rank
    dst = np.empty(count, dtype=src.dtype)
    written = np.zeros(count, dtype=int)
    for blk in range(cfg.grid):
        ta, tb, sb, db = _tile_block(d, br, blk)
        a0, b0 = ta * TA, tb * TB
        tile = np.full((TB, pitch), -1, dtype=np.int64)
        for ty in range(rows):
            for tx in range(32):
                a = a0 + tx // G
                if a < A:
                    for k in range(K):
                        rb = ty + rows * k
                        if b0 + rb < B:
                            tile[rb, tx] = sb + a * G + tx % G + (b0 + rb) * isb
        for ty in range(rows):
            for k in range(K):
                warp_rows, units = set(), []
                for tx in range(32):
                    L = tx + 32 * (ty + rows * k)
                    ra, c = L // (TB * G), L % (TB * G)
                    warp_rows.add(ra)
                    a, b = a0 + ra, b0 + c // G
                    if not (a < A and b < B):
                        continue
                    o = db + a * osa + b * G + c % G
                    e = tile[c // G, ra * G + c % G]
                    assert e >= 0
                    units.append((tx, (c // G) * pitch + ra * G + c % G))
                    dst[o] = src[e]
                    written[o] += 1
                assert len(warp_rows) == 1
                per_phase = 128 // C  # threads served per shared-memory wavefront
                for ph in range(32 // per_phase):
                    banks = [(u * C // 4) % 32 for tx, u in units if tx // per_phase == ph]
                    assert len(banks) == len(set(banks)), (cfg, ph, banks)
    assert (written == 1).all()
    return dst


def _emulator(cfg):
    if cfg.variant == "tiled_grouped":
        return emulate_grouped
    return emulate_tiled if cfg.variant.startswith("tiled") else emulate_nd


def emulate_tiled(cfg, src):
    """ops_tile_transpose_kernel on elements ``src`` (1-D array of moved elements): every block and thread,
    packed words as groups of P elements; also checks that each packed gather is bank-conflict-free (word
    indices distinct mod L within each wavefront of L = 128 / W threads, W the word's bytes). Loose words
    start anywhere and are cut at the row's end (the elements past it are -1 in the tile and never written)."""
    d, pk, rows = cfg.data, cfg.pack, cfg.block[1]
    lanes = 128 // (cfg.chunk * pk)  # threads per shared-memory wavefront
    tile_edge = 32 * pk
    br = cfg.batch_rank
    A, B, isb, osa = d["A"], d["B"], d["isb"], d["osa"]
    count = d["count"]
    dst = np.empty(count, dtype=src.dtype)
    written = np.zeros(count, dtype=int)
    unit = d["align"]  # shifted tile: elements per 32-byte sector (0: the plain tile)
    loose = d["loose"]
    assert not (loose and unit)
    extra = unit - pk if unit else 0
    b_lo = d["bl"] if d["split_b"] else B  # split B: row b of the plane is (b // bl, b % bl) in the input
    b_div = _divisor(b_lo)

    def row_offset(b):
        hi = b_div(b)
        assert hi == b // b_lo
        return hi * d.get("isbh", 0) + (b - hi * b_lo) * isb
    for blk in range(cfg.grid):
        ta, tb, sb, db = _tile_block(d, br, blk)
        a0, b0 = ta * tile_edge, tb * tile_edge
        tile = np.full((tile_edge + extra, 33, pk), -1, dtype=np.int64)  # element indices into src
        for ty in range(rows):
            for tx in range(32):
                a = a0 + tx * pk
                if a < A:
                    for k in range(-(-(tile_edge + extra) // rows)):
                        lb = ty + rows * k
                        b = b0 - extra + lb  # tile row lb holds input row b
                        if lb < tile_edge + extra and 0 <= b < B:
                            e = sb + row_offset(b) + a
                            assert loose or (e % pk == 0 and a + pk <= A)
                            valid = min(pk, A - a)
                            tile[lb, tx, :valid] = np.arange(e, e + valid)
        for ty in range(rows):
            for m in range(32 // rows):
                g = ty + rows * m  # the thread's group: output rows pk * g + r, r < pk
                for r in range(pk):
                    row = db + (a0 + pk * g + r) * osa  # output offset of the row's column 0
                    shift = row % unit if unit else 0
                    row0 = extra - shift  # tile row of the row's first column
                    if unit:
                        assert (row + b0 - shift) % unit == 0  # the warp's segment starts on a sector
                    slots = [[set() for _ in range(32 // lanes)] for _ in range(pk)]
                    for tx in range(32):
                        b, a_left = b0 - shift + tx * pk, A - a0
                        if not (0 <= b < B and pk * g + r < a_left):
                            continue
                        rot = (tx // (lanes // pk)) % pk if pk > 1 else 0
                        loaded = []  # loop step i loads tile row row0 + tx * pk + (i + rot) % pk, column g
                        for i in range(pk):
                            if pk > 1:
                                slots[i][tx // lanes].add((row0 + tx * pk + (i + rot) % pk) * 33 + g)
                            loaded.append(tile[row0 + tx * pk + (i + rot) % pk, g])
                        # element i of the transposed word: loaded word i's element r; the funnel shift by rot
                        # elements (np.roll) puts row j's element at position j
                        elems = np.roll([loaded[i][r] for i in range(pk)], rot)
                        assert list(elems) == [tile[row0 + tx * pk + j, g, r] for j in range(pk)]
                        o, valid = row + b, min(pk, B - b)
                        assert loose or (o % pk == 0 and valid == pk)
                        assert all(e >= 0 for e in elems[:valid])
                        dst[o:o + valid] = src[np.array(elems[:valid])]
                        written[o:o + valid] += 1
                    if pk > 1:
                        full = [w for step in slots for w in step if len(w) == lanes]
                        assert all(len({word % lanes for word in w}) == lanes for w in full)
    assert (written == 1).all()
    return dst


EMULATED = [
    ((5, 6, 7, 8), (2, 3, 0, 1), "float32"),
    ((33, 1, 65), (2, 1, 0), "float32"),
    ((3, 70, 37), (0, 2, 1), "float32"),
    ((2, 37, 3, 41), (3, 1, 2, 0), "float32"),
    ((2, 17, 3, 19, 2), (0, 3, 2, 1, 4), "float64"),       # 16-byte elements after chunking, batch rank 2
    ((2, 17, 3, 2, 19), (0, 4, 3, 2, 1), "int16"),         # batch rank 3
    ((2, 64, 96), (0, 2, 1), "float16"),                   # packed pairs, full tiles
    ((3, 66, 34), (0, 2, 1), "bfloat16"),                  # packed pairs, partial tiles
    ((136, 68), (1, 0), "int8"),                           # packed quads
    ((70, 39), (1, 0), "int8"),                            # 1-byte elements, not packable
    ((6, 5, 4), (1, 0, 2), "float32"),
    ((4, 7, 3, 5), (3, 1, 0, 2), "int16"),
    ((17, 40, 3), (0, 2, 1), "float32"),
    ((5, 7), (0, 1), "float32"),
    ((40, 33, 8), (1, 0, 2), "float32"),                   # grouped, G = 2, partial tiles
    ((3, 37, 20, 16), (0, 2, 1, 3), "float32"),            # grouped, G = 4, batch rank 1
    ((20, 2, 9, 32), (2, 1, 0, 3), "float32"),             # grouped, G = 8, batch rank 1, a = 9 > 32 / G
    ((33, 70, 64), (1, 0, 2), "int8"),                     # grouped, G = 4 of 16 bytes
    ((6, 5, 7, 3, 40), (3, 1, 4, 2, 0), "float16"),        # split B (7 x 6), packed pairs, partial tiles
    ((5, 4, 9, 20), (3, 2, 1, 0), "int64"),                # split B (4 x 5), plain tile, shifted (64-byte units)
    ((6, 7, 40), (2, 1, 0), "float32"),                    # split B (7 x 6), also as transpose_add
]


@pytest.mark.parametrize("shape, perm, dtype", EMULATED)
def test_emulated_cuda_kernels(shape, perm, dtype, rng):
    for op in ("permute", "transpose_add"):
        if op == "transpose_add" and sum(a != b for a, b in zip(perm, range(len(perm)))) not in (0, 2):
            continue
        cfg = P.select_config(shape, perm, dtype, op)
        if cfg.variant == "copy":
            continue
        n_elems = math.prod(shape)
        x = np.arange(n_elems, dtype=np.int64)
        # moved elements of cfg.chunk bytes: group the element ids
        per = cfg.chunk // np.dtype(np.float16 if dtype == "bfloat16" else dtype).itemsize
        moved = x.reshape(-1, per)
        ids = np.arange(moved.shape[0])
        got_ids = _emulator(cfg)(cfg, ids)
        got = moved[got_ids].reshape(-1)
        want = np.transpose(x.reshape(shape), perm).reshape(-1)
        np.testing.assert_array_equal(got, want)


WORD8_EMULATED = [
    ((2, 128, 192), (0, 2, 1), "float16"),   # 8-byte words of 4 halves, full 128-element tiles
    ((3, 132, 136), (0, 2, 1), "bfloat16"),  # partial tiles
    ((200, 260), (1, 0), "float16"),         # 2-D, partial tiles on both sides
    ((3, 70, 100), (0, 2, 1), "float32"),    # 2 floats per 8-byte word, 64-element tiles, partial
]


@pytest.mark.parametrize("shape, perm, dtype", WORD8_EMULATED)
def test_emulated_eight_byte_words(shape, perm, dtype, rng, monkeypatch):
    monkeypatch.setattr(P, "PACK_WORD", "8")
    cfg = P.select_config(shape, perm, dtype)
    assert (cfg.variant, cfg.pack) == ("tiled_packed", 8 // cfg.chunk)
    test_emulated_cuda_kernels(shape, perm, dtype, rng)


def test_pack_word_switch(monkeypatch):
    shape, perm = (32, 1024, 1024), (0, 2, 1)
    assert P.PACK_WORD == "auto" and P.select_config(shape, perm, "float16").pack == 2
    monkeypatch.setattr(P, "PACK_WORD", "4")
    assert P.select_config((8192, 8192), (1, 0), "float16").pack == 2
    assert P.select_config(shape, perm, "float32").pack == 1
    monkeypatch.setattr(P, "PACK_WORD", "8")
    assert P.select_config(shape, perm, "bfloat16", "transpose_add").pack == 4
    assert P.select_config(shape, perm, "int8").pack == 4  # 1-byte elements keep 4-byte words
    assert P.select_config(shape, perm, "float32").pack == 2
    assert P.select_config(shape, perm, "float64").pack == 1
    assert P.select_config((32, 60, 1024), perm, "float16").pack == 2  # 60 < a 128-half edge: 4-byte words
    assert P.select_config((32, 30, 1024), perm, "float16").pack == 1  # below half a 64-half edge too
    assert "ops_permute_tiled<2, 4, int, 16, 0, 0, 0>" in P.render(P.select_config(shape, perm, "float16"))


ORDER_A_EMULATED = [((70, 100), (1, 0), "float32"), ((3, 132, 136), (0, 2, 1), "float16"),
                    ((33, 40, 8), (1, 0, 2), "float32")]


@pytest.mark.parametrize("shape, perm, dtype", ORDER_A_EMULATED)
def test_emulated_tile_order_along_a(shape, perm, dtype, rng, monkeypatch):
    """The A/B switch's other block order (consecutive blocks along A) still covers every tile once."""
    monkeypatch.setattr(P, "TILE_ORDER", "a")
    assert P.select_config(shape, perm, dtype).data["b_fast"] == 0
    test_emulated_cuda_kernels(shape, perm, dtype, rng)


def test_tile_order_switch(monkeypatch):
    shape, perm = (24300, 11520), (1, 0)
    assert P.TILE_ORDER == "b" and P.select_config(shape, perm, "bfloat16").data["b_fast"] == 1
    assert P.select_config((33, 40, 8), (1, 0, 2), "float32").data["b_fast"] == 0  # grouped: one order only
    monkeypatch.setattr(P, "TILE_ORDER", "a")
    assert P.select_config(shape, perm, "bfloat16", "transpose_add").data["b_fast"] == 0
    monkeypatch.setattr(P, "TILE_ORDER", "b")
    assert P.select_config(shape, perm, "float32").data["b_fast"] == 1


SHIFTED = [  # (shape, perm, dtype, mode, expected elements per aligned unit)
    ((97, 70), (1, 0), "float32", "auto", 16),           # output rows of 388 bytes, plain tile: 64-byte units
    ((70, 97), (1, 0), "float16", "32", 16),             # odd rows: P = 1, 15 extra rows
    ((3, 132, 142), (0, 2, 1), "float16", "auto", 16),   # 284-byte rows, 4-byte words of 2 halves
    ((3, 136, 140), (0, 2, 1), "bfloat16", "32", 16),    # 280-byte rows, 8-byte words of 4 halves
    ((2, 68, 132), (0, 2, 1), "int8", "auto", 32),       # 68-byte rows, 1-byte quads, 28 extra rows
    ((36, 3, 70), (2, 1, 0), "float32", "auto", 16),     # the batch stride misaligned too
    ((3, 132, 142), (0, 2, 1), "float16", "64", 32),     # 64-byte units
    ((64, 72), (1, 0), "float32", "32", 8),              # forced on aligned rows: every shift 0
]


@pytest.mark.parametrize("shape, perm, dtype, mode, unit", SHIFTED)
def test_emulated_shifted_tile(shape, perm, dtype, mode, unit, rng, monkeypatch):
    """The shifted tile (output rows that do not start on a sector): every element once, every warp's row
    segment on a sector boundary, conflict-free gathers; for the permute and for transpose_add's 2-D swaps."""
    if mode != "auto":
        monkeypatch.setattr(P, "ALIGN_OUT", mode)
    cfg = P.select_config(shape, perm, dtype)
    assert cfg.variant.startswith("tiled") and cfg.data["align"] == unit
    test_emulated_cuda_kernels(shape, perm, dtype, rng)


LOOSE = [  # (shape, perm, dtype, mode, expected pack): rows that do not start on a word
    ((70, 97), (1, 0), "float16", "4", 2),                # odd rows on both sides, partial words at both ends
    ((133, 141), (1, 0), "bfloat16", "8", 4),              # 8-byte words of 4 halves, 128-element tiles
    ((3, 67, 70), (0, 2, 1), "int8", "4", 4),              # 1-byte quads, the batch stride off a word too
    ((65, 131), (1, 0), "float32", "8", 2),                # 2 floats per 8-byte word
    ((6, 5, 7, 3, 41), (3, 1, 4, 2, 0), "float16", "4", 2),  # split B (7 x 6) with an odd a side
]


@pytest.mark.parametrize("shape, perm, dtype, mode, pack", LOOSE)
def test_emulated_loose_words(shape, perm, dtype, mode, pack, rng, monkeypatch):
    """Loose words: every element once, the last word of a row cut at its end; for transpose_add's 2-D swaps
    too. With the switch at "0" the same shapes take the plain tile."""
    monkeypatch.setattr(P, "LOOSE_WORD", "0")
    cfg = P.select_config(shape, perm, dtype)
    assert cfg.pack == 1 and cfg.data["loose"] == 0
    monkeypatch.setattr(P, "LOOSE_WORD", mode)
    cfg = P.select_config(shape, perm, dtype)
    assert (cfg.variant, cfg.pack, cfg.data["loose"], cfg.data["align"]) == ("tiled_packed", pack, 1, 0)
    assert P.render(cfg).split("(")[0].endswith(", 1>")
    test_emulated_cuda_kernels(shape, perm, dtype, rng)


def test_loose_word_rule(monkeypatch):
    def got(shape, perm, dtype, op="permute"):
        cfg = P.select_config(shape, perm, dtype, op)
        return cfg.pack, cfg.data.get("loose")
    # the measured default: 1-byte elements, and 4-byte ones in transpose_add; never 2-byte ones
    assert P.LOOSE_WORD == "auto"
    assert got((4097, 3071), (1, 0), "float16") == (1, 0)
    assert got((4097, 3071), (1, 0), "bfloat16", "transpose_add") == (1, 0)
    for dtype in ("int8", "uint8", "bool"):
        assert got((4097, 3071), (1, 0), dtype) == (4, 1) and got((64, 1027, 1025), (0, 2, 1), dtype) == (4, 1)
    assert got((4097, 3071), (1, 0), "uint8", "transpose_add") == (4, 1)
    assert got((4097, 3071), (1, 0), "float32") == (1, 0)   # permute: the shifted tile wins
    assert got((4097, 3071), (1, 0), "float32", "transpose_add") == (2, 1)
    assert got((8, 1025, 1023), (0, 2, 1), "float32", "transpose_add") == (2, 1)
    assert got((64, 1024, 1024), (0, 2, 1), "int8") == (4, 0)  # aligned rows keep aligned words
    assert got((4097, 3071), (1, 0), "int32", "transpose_add") == (2, 1)
    assert got((4097, 3071), (1, 0), "float64", "transpose_add") == (1, 0)
    monkeypatch.setattr(P, "LOOSE_WORD", "0")
    assert got((4097, 3071), (1, 0), "int8") == (1, 0) and got((4097, 3071), (1, 0), "float32", "transpose_add") == (
        1, 0)
    monkeypatch.setattr(P, "LOOSE_WORD", "4")
    assert got((4097, 3071), (1, 0), "float16") == (2, 1) and got((4097, 3071), (1, 0), "float16", "transpose_add") == (
        2, 1)
    assert got((4097, 3071), (1, 0), "float32") == (1, 0)     # 4-byte elements: only 8-byte loose words
    assert got((4097, 3071), (1, 0), "int8") == (4, 1)
    assert got((32, 1024, 1024), (0, 2, 1), "float16") == (2, 0)  # aligned rows keep aligned words
    assert got((31, 3071), (1, 0), "float16") == (1, 0)       # 31 < half a 64-element edge
    assert got((4097, 3071), (1, 0), "float64") == (1, 0)
    monkeypatch.setattr(P, "LOOSE_WORD", "8")
    assert got((4097, 3071), (1, 0), "float16") == (4, 1) and got((4097, 3071), (1, 0), "float32") == (2, 1)
    assert got((4097, 3071), (1, 0), "int8") == (4, 1)        # 1-byte elements: 4-byte words
    assert got((4097, 127), (1, 0), "float16") == (1, 0)      # below a whole 128-element edge


def test_align_out_rule(monkeypatch):
    def unit(shape, perm, dtype, op="permute"):
        return P.select_config(shape, perm, dtype, op).data["align"]
    assert unit((24300, 11520), (1, 0), "bfloat16") == 16          # 48600-byte output rows
    assert unit((24300, 11520), (1, 0), "bfloat16", "transpose_add") == 0  # measured slower shifted
    assert unit((11520, 24300), (1, 0), "bfloat16") == 0           # 23040-byte rows: whole sectors
    assert unit((32, 1028, 1024), (0, 2, 1), "float16") == 16 and unit((64, 1028, 1024), (0, 2, 1), "int8") == 32
    assert unit((4097, 3071), (1, 0), "float32") == 16             # plain tile: 64-byte units
    assert unit((4097, 3071), (1, 0), "float16") == 0              # 2-byte words: measured slower shifted
    assert unit((4097, 3071), (1, 0), "int8") == 0
    assert unit((8192, 8192), (1, 0), "float32") == 0 and unit((32, 1024, 1024), (0, 2, 1), "int8") == 0
    cfg = P.select_config((4097, 3071), (1, 0), "float32")
    assert cfg.data["tiles_b"] == -(-(4097 + 15) // 32)  # the shifted rows reach 15 columns into one more tile
    monkeypatch.setattr(P, "ALIGN_OUT", "0")
    assert unit((24300, 11520), (1, 0), "bfloat16") == 0
    monkeypatch.setattr(P, "ALIGN_OUT", "64")
    assert unit((24300, 11520), (1, 0), "bfloat16", "transpose_add") == 32
    assert unit((8192, 8192), (1, 0), "float32") == 16 and unit((4097, 3071), (1, 0), "float16") == 32
    assert unit((4097, 3071), (1, 0), "int8") == 0  # 63 extra rows: no room in a 32-row tile


def test_random_plans_and_emulation(rng):
    """Random shapes and permutations: the plan is the same permutation, and the emulated kernel of whatever
    variant is picked (with random dims near the tile thresholds) moves every element to its place."""
    for _ in range(40):
        ndim = int(rng.integers(1, 6))
        shape = tuple(int(rng.choice([1, 2, 3, 5, 16, 17, 33, 34])) for _ in range(ndim))
        perm = tuple(int(p) for p in rng.permutation(ndim))
        dtype = str(rng.choice(["int8", "float16", "float32", "float64"]))
        itemsize = _codegen.ITEMSIZE[dtype]
        x = np.arange(math.prod(shape))
        plan = P.plan_permute(shape, perm, itemsize)
        per = plan.chunk // itemsize
        moved = x.reshape(-1, per)
        want = np.transpose(x.reshape(shape), perm).reshape(-1)
        via_plan = np.transpose(np.arange(plan.count).reshape(plan.in_dims), plan.perm).reshape(-1)
        np.testing.assert_array_equal(moved[via_plan].reshape(-1), want, err_msg=f"{shape} {perm} {dtype}")
        cfg = P.select_config(shape, perm, dtype)
        if cfg.variant in ("copy", "fallback") or x.size > 6000:
            continue
        got = moved[_emulator(cfg)(cfg, np.arange(plan.count))].reshape(-1)
        np.testing.assert_array_equal(got, want, err_msg=f"{shape} {perm} {dtype} {cfg.variant}")


# ---- values -----------------------------------------------------------------------------------------------

PERMUTE_SHAPES = [
    ((37, 70), (1, 0)),                   # tiled, partial tiles
    ((64, 128), (1, 0)),                  # packed where 1-2 byte
    ((3, 66, 34), (0, 2, 1)),             # batch, partial packed tiles
    ((5, 6, 7, 8), (2, 3, 0, 1)),         # merges to (30,56) (1,0)
    ((6, 5, 4), (1, 0, 2)),               # general, chunked last dim
    ((4, 7, 3, 5), (3, 1, 0, 2)),         # general, last dim moves (small)
    ((2, 17, 3, 19, 2), (0, 3, 2, 1, 4)),  # tiled after chunking (16 bytes for float64)
    ((2, 17, 3, 2, 19), (0, 4, 3, 2, 1)),  # tiled, batch rank 3
    ((33, 1, 65), (2, 1, 0)),             # size-1 dim
    ((1, 1), (1, 0)),                     # one element
    ((9,), (0,)),                         # copy
    ((1, 5), (1, 0)),                     # copy (size-1 swap)
    ((136, 68), (1, 0)),                  # packed quads for 1-byte dtypes
    ((6, 5, 7, 3, 40), (3, 1, 4, 2, 0)),  # split B (the output's last two dims, 7 x 6), partial tiles
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_permute_values(dtype, device, rng):
    for shape, perm in PERMUTE_SHAPES:
        x = random_array(shape, dtype, rng)
        got = to_np(ops.permute(to_var(x, dtype), perm))
        want = np.transpose(x, perm)
        assert got.shape == want.shape, (shape, perm)
        np.testing.assert_array_equal(got, want, err_msg=f"{shape} {perm} {dtype}")


ADD_SHAPES = [
    ((37, 70), 0, 1), ((64, 128), 0, 1), ((3, 66, 34), 1, 2), ((6, 5, 4), 0, 1), ((6, 5, 3), 1, 0),
    ((4, 5), 1, 1), ((4, 3, 5), -1, 0), ((1, 7), 0, 1), ((136, 68), 0, 1), ((2, 17, 3, 19), 1, 3),
    ((6, 7, 40), 0, 2),  # split B (7 x 6)
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_add_values(dtype, device, rng):
    for shape, d0, d1 in ADD_SHAPES:
        x = random_array(shape, dtype, rng)
        y = random_array(swapped(shape, d0 % len(shape), d1 % len(shape)), dtype, rng)
        got = to_np(ops.transpose_add(to_var(x, dtype), to_var(y, dtype), d0, d1))
        want = add_reference(x, y, d0 % len(shape), d1 % len(shape), dtype)
        assert got.shape == want.shape
        assert_close_add(got, want, dtype)


def test_transpose_and_module(device, rng):
    x = random_array((4, 5, 6), "float32", rng)
    xv = jt.array(x)
    np.testing.assert_array_equal(ops.transpose(xv, 0, -1).numpy(), np.swapaxes(x, 0, 2))
    np.testing.assert_array_equal(ops.permute(xv, 2, 0, 1).numpy(), np.transpose(x, (2, 0, 1)))
    np.testing.assert_array_equal(ops.permute(xv, [-1, 0, 1]).numpy(), np.transpose(x, (2, 0, 1)))
    np.testing.assert_array_equal(ops.Permute(1, 2, 0)(xv).numpy(), np.transpose(x, (1, 2, 0)))
    np.testing.assert_array_equal(ops.Permute((1, 2, 0))(xv).numpy(), np.transpose(x, (1, 2, 0)))
    y = random_array((4, 6, 5), "float32", rng)
    got = ops.TransposeAdd(1, 2)(xv, jt.array(y)).numpy()
    np.testing.assert_array_equal(got, np.swapaxes(x, 1, 2) + y)
    assert isinstance(ops.Permute(0, 1), jt.Module) and isinstance(ops.TransposeAdd(), jt.Module)


def test_fallback_rank_9(device, rng):
    shape = (2, 3, 2, 3, 2, 3, 2, 3, 2)
    perm = (8, 6, 4, 2, 0, 7, 5, 3, 1)
    assert P.select_config(shape, perm, "float32").variant == "fallback"
    x = random_array(shape, "float32", rng)
    np.testing.assert_array_equal(ops.permute(jt.array(x), perm).numpy(), np.transpose(x, perm))


def test_zero_size(device, rng):
    x = jt.array(np.zeros((0, 3, 4), np.float32))
    y = ops.permute(x, 2, 0, 1)
    assert tuple(y.shape) == (4, 0, 3) and y.numpy().shape == (4, 0, 3)
    s = ops.transpose_add(x, jt.array(np.zeros((3, 0, 4), np.float32)), 0, 1)
    assert s.numpy().shape == (3, 0, 4)
    g = jt.grad((ops.permute(x, 1, 0, 2) * 2).sum(), x)
    assert g.numpy().shape == (0, 3, 4)


# ---- gradients --------------------------------------------------------------------------------------------

def _grad_permute(x, perm, w):
    y = ops.permute(x, perm)
    return jt.grad((y * w).sum(), x)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_permute_grad(dtype, device, rng):
    for shape, perm in [((3, 66, 34), (0, 2, 1)), ((4, 7, 3, 5), (3, 1, 0, 2)), ((6, 5, 4), (1, 0, 2))]:
        x = random_array(shape, dtype, rng)
        w = random_array(tuple(shape[p] for p in perm), dtype, rng)
        xv, wv = jt.array(x), jt.array(w)
        g1 = _grad_permute(xv, perm, wv).numpy()
        inv = np.argsort(perm)
        np.testing.assert_array_equal(g1, np.transpose(w, inv))
        g2 = _grad_permute(xv, perm, wv).numpy()
        assert g1.tobytes() == g2.tobytes()  # deterministic, bit for bit


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transpose_add_grad(dtype, device, rng):
    shape, d0, d1 = (3, 40, 50), 1, 2
    x = random_array(shape, dtype, rng)
    y = random_array(swapped(shape, d0, d1), dtype, rng)
    w = random_array(swapped(shape, d0, d1), dtype, rng)
    xv, yv, wv = to_var(x, dtype), to_var(y, dtype), to_var(w, dtype)

    def grads():
        s = ops.transpose_add(xv, yv, d0, d1)
        return [to_np(g) for g in jt.grad((s * wv).sum(), [xv, yv])]
    gx, gy = grads()
    np.testing.assert_array_equal(gx, np.swapaxes(w, d0, d1))
    np.testing.assert_array_equal(gy, w)
    gx2, gy2 = grads()
    assert gx.tobytes() == gx2.tobytes() and gy.tobytes() == gy2.tobytes()


# ---- errors -----------------------------------------------------------------------------------------------

def test_dims_as_jittor_vars():
    """A one-element integer Var is a dim (as a 0-d integer tensor is in PyTorch); any other Var is a
    TypeError naming the argument (jittor's own __index__ raises a RuntimeError, or truncates a float)."""
    x = jt.array(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    want = np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(2, 0, 1)
    np.testing.assert_array_equal(ops.permute(x, jt.array(2), 0, 1).numpy(), want)
    np.testing.assert_array_equal(ops.transpose(x, jt.array([0]), jt.array(2, "int64")).numpy(),
                                  np.swapaxes(x.numpy(), 0, 2))
    with pytest.raises(TypeError, match=r"dims\[0\] must be an int, got a jittor Var of dtype int32 and shape \(2,\)"):
        ops.permute(x, jt.array([2, 0]), 1)
    with pytest.raises(TypeError, match=r"dims\[1\] must be an int, got a jittor Var of dtype float32"):
        ops.permute(x, (0, jt.array(1.0), 2))
    with pytest.raises(TypeError, match="dim0 must be an int, got a jittor Var"):
        ops.transpose(x, jt.array([0, 1]), 1)
    with pytest.raises(TypeError, match="dim1 must be an int, got a jittor Var"):
        ops.transpose_add(x, x, 0, jt.array(1.5))
    with pytest.raises(TypeError, match=r"dims\[2\] must be an int"):
        ops.Permute(0, 1, jt.array([2, 2]))
    with pytest.raises(TypeError, match="dim0 must be an int"):
        ops.TransposeAdd(jt.array([0.0]))


def test_errors():
    x = jt.array(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(TypeError, match="x"):
        ops.permute(np.zeros((2, 3)), 1, 0)
    with pytest.raises(ValueError, match="dims"):
        ops.permute(x, 0, 1)
    with pytest.raises(ValueError, match="dims"):
        ops.permute(x, (0, 1))
    with pytest.raises(ValueError, match="dims"):
        ops.permute(x, 0, 1, 1)
    with pytest.raises(ValueError, match="dims"):
        ops.permute(x, 0, 1, 3)
    with pytest.raises(ValueError, match="dims"):
        ops.permute(x, 0, -4, 1)
    with pytest.raises(TypeError, match="dims"):
        ops.permute(x, 0, 1.0, 2)
    with pytest.raises(TypeError, match="dims"):
        ops.permute(x, 0, True, 2)
    with pytest.raises(TypeError, match="dims"):
        ops.Permute(0, "1")
    with pytest.raises(ValueError, match="dim0"):
        ops.transpose(x, 3, 0)
    with pytest.raises(ValueError, match="dim1"):
        ops.transpose(x, 0, -4)
    with pytest.raises(TypeError, match="dim0"):
        ops.transpose(x, None, 0)
    y = jt.array(np.zeros((3, 2, 4), np.float32))
    with pytest.raises(TypeError, match="x"):
        ops.transpose_add([1], y)
    with pytest.raises(TypeError, match="y"):
        ops.transpose_add(x, np.zeros((3, 2, 4)))
    with pytest.raises(TypeError, match="y"):
        ops.transpose_add(x, y.float16())
    with pytest.raises(ValueError, match="y"):
        ops.transpose_add(x, y, 0, 2)
    with pytest.raises(ValueError, match="y"):
        ops.transpose_add(x, jt.array(np.zeros((3, 2), np.float32)))
    with pytest.raises(ValueError, match="dim1"):
        ops.transpose_add(x, y, 0, 5)
    with pytest.raises(TypeError, match="dim0"):
        ops.TransposeAdd(dim0="a")
    with pytest.raises(ValueError, match="dims"):
        ops.Permute(0, 0)


# ---- the case table ---------------------------------------------------------------------------------------

def test_family_table():
    fam = fam_permute.FAMILY
    assert fam.name == "permute"
    ids = [c.id for c in fam.cases]
    assert len(ids) == len(set(ids))
    for c in fam.cases:
        op = c.p.get("op")
        assert op in ("permute", "transpose_add")
        if op == "transpose_add":
            assert c.shapes[1] == swapped(c.shapes[0], c.p["dim0"], c.p["dim1"])
        assert fam.variant(c, ops) != "-"
        assert fam.bytes_moved(c) > 0
        if "cuda" in c.devices:
            assert fam.bytes_moved(c) <= 3 * 2**30
    assert any("cpu" in c.devices for c in fam.cases) and any("cuda" in c.devices for c in fam.cases)


@pytest.mark.parametrize("c", [c for c in fam_permute.FAMILY.cases if "cpu" in c.devices], ids=lambda c: c.id)
def test_family_cpu_cases(c, rng):
    fam = fam_permute.FAMILY
    arrays = fam.make_inputs(c, rng)
    xs = [to_var(a, c.dtype if a.dtype.kind == "f" else str(a.dtype)) for a in arrays]
    rtol, atol = fam.tolerance(c)
    if c.direction == "fwd":
        got = [to_np(v) for v in fam.forward(c, ops, xs)]
        want = fam.reference_forward(c, arrays)
    else:
        outs = fam.forward(c, ops, xs)
        dys = [random_array(tuple(o.shape), c.dtype, rng) for o in outs]
        loss = sum((o * to_var(d, c.dtype)).sum() for o, d in zip(outs, dys))
        got = [to_np(g) for g in jt.grad(loss, [xs[i] for i in c.grad_of])]
        want = fam.reference_backward(c, arrays, dys)
    for g, w in zip(got, want):
        if np.asarray(w).dtype.kind in "fc":
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)


# ---- GPU-sized dispatch paths (run with -m cuda) -----------------------------------------------------------

CUDA_PERMUTE = [
    ((16, 1024, 1024), (0, 2, 1), "float32"),
    ((32, 1024, 1024), (0, 2, 1), "float16"),
    ((32, 1024, 1024), (0, 2, 1), "int8"),
    ((4097, 3071), (1, 0), "float32"),
    ((4097, 3071), (1, 0), "float16"),
    ((1024, 1024, 16), (1, 0, 2), "float32"),     # grouped, G = 4
    ((1024, 512, 8), (1, 0, 2), "float32"),       # grouped, G = 2
    ((32, 512, 16, 64), (0, 2, 1, 3), "float16"),  # grouped, G = 8, batch rank 1
    ((1000, 999, 12), (1, 0, 2), "float32"),      # general: 3 chunks per row
    ((32, 64, 128, 64), (2, 3, 0, 1), "float32"),
    ((16, 32, 16, 32, 32), (0, 4, 2, 1, 3), "float32"),
    ((2048, 2048), (1, 0), "int64"),
    ((8, 24, 40, 16, 64), (3, 1, 4, 2, 0), "float16"),  # split B (40 x 8), packed pairs
    ((8, 24, 40, 16, 64), (3, 1, 4, 2, 0), "float32"),  # split B, 8-byte words
]


@pytest.mark.cuda
@pytest.mark.parametrize("shape, perm, dtype", CUDA_PERMUTE)
def test_cuda_large_permute(shape, perm, dtype, rng):
    jt.flags.use_cuda = 1
    try:
        x = random_array(shape, dtype, rng)
        got = to_np(ops.permute(to_var(x, dtype), perm))
        np.testing.assert_array_equal(got, np.transpose(x, perm))
    finally:
        jt.flags.use_cuda = 0


CUDA_ADD = [((2000, 1500, 8), 0, 1, "float32"), ((8192, 4096), 0, 1, "bfloat16"), ((4096, 4096), 0, 1, "float32"),
            ((4097, 3071), 0, 1, "float16"),
            ((16, 1024, 1024), 1, 2, "float32"), ((2048, 4096), 0, 1, "int8"),
            ((8, 40, 64), 0, 2, "float32")]  # split B (40 x 8)


@pytest.mark.cuda
@pytest.mark.parametrize("shape, d0, d1, dtype", CUDA_ADD)
def test_cuda_large_transpose_add(shape, d0, d1, dtype, rng):
    jt.flags.use_cuda = 1
    try:
        x = random_array(shape, dtype, rng)
        y = random_array(swapped(shape, d0, d1), dtype, rng)
        got = to_np(ops.transpose_add(to_var(x, dtype), to_var(y, dtype), d0, d1))
        assert_close_add(got, add_reference(x, y, d0, d1, dtype), dtype)
    finally:
        jt.flags.use_cuda = 0


def check_on_gpu(shape, perm, dtype, op, rng):
    """``op`` ("permute" or "transpose_add" of the two dims ``perm`` swaps) on the GPU against NumPy."""
    x = random_array(shape, dtype, rng)
    want = np.transpose(x, perm)
    if op == "transpose_add":
        d0, d1 = [k for k, p in enumerate(perm) if k != p]
        y = random_array(want.shape, dtype, rng)
        got = to_np(ops.transpose_add(to_var(x, dtype), to_var(y, dtype), d0, d1))
        assert_close_add(got, add_reference(x, y, d0, d1, dtype), dtype)
    else:
        np.testing.assert_array_equal(to_np(ops.permute(to_var(x, dtype), perm)), want)


def check_forced_on_gpu(monkeypatch, switch, mode, holds, shape, perm, dtype, op, rng):
    """``check_on_gpu`` with the module switch ``switch`` set to ``mode``; ``holds(cfg)`` checks that
    the plan took it."""
    monkeypatch.setattr(P, switch, mode)
    ops._launch.reload_switches()  # forget the plans made under the default
    jt.flags.use_cuda = 1
    try:
        assert holds(P.select_config(shape, perm, dtype, op))
        check_on_gpu(shape, perm, dtype, op, rng)
    finally:
        jt.flags.use_cuda = 0


@pytest.mark.cuda
@pytest.mark.parametrize("shape, perm, dtype, op", [
    ((32, 1024, 1024), (0, 2, 1), "float16", "permute"),
    ((8192, 4096), (1, 0), "bfloat16", "transpose_add"),
    ((3, 132, 260), (0, 2, 1), "bfloat16", "permute"),         # partial tiles on both sides
    ((2, 200, 4, 136), (0, 3, 2, 1), "float16", "transpose_add"),  # batch rank 2, partial tiles
    ((4096, 4096), (1, 0), "float32", "transpose_add"),            # 2 floats per word
    ((3, 130, 100), (0, 2, 1), "float32", "permute"),
])
def test_cuda_eight_byte_words(shape, perm, dtype, op, rng, monkeypatch):
    """8-byte words forced (PACK_WORD = "8"; the default takes them by the measured rule): 2-byte
    elements moved 4 to a word, 4-byte elements 2."""
    check_forced_on_gpu(monkeypatch, "PACK_WORD", "8", lambda cfg: cfg.pack == 8 // _codegen.ITEMSIZE[dtype],
                        shape, perm, dtype, op, rng)


@pytest.mark.cuda
@pytest.mark.parametrize("shape, perm, dtype, op, mode", [
    ((4097, 3071), (1, 0), "float16", "permute", "4"),          # the score case's shape, 4-byte words
    ((4097, 3071), (1, 0), "float16", "transpose_add", "8"),    # 8-byte words of 4 halves
    ((3, 133, 141), (0, 2, 1), "bfloat16", "transpose_add", "4"),
    ((4097, 3071), (1, 0), "float32", "permute", "8"),          # 2 floats per word
    ((2, 67, 1030), (0, 2, 1), "int8", "permute", "4"),         # quads
    ((6, 5, 7, 3, 41), (3, 1, 4, 2, 0), "float16", "permute", "4"),  # split B
    ((1025, 3071), (1, 0), "bool", "permute", "auto"),          # the default rule: 1-byte elements
    ((131, 1027), (1, 0), "uint8", "transpose_add", "auto"),
    ((3, 1025, 1023), (0, 2, 1), "float32", "transpose_add", "auto"),  # 4-byte elements in transpose_add
])
def test_cuda_loose_words(shape, perm, dtype, op, mode, rng, monkeypatch):
    """Loose words (forced by LOOSE_WORD, or by its default rule) on rows that do not start on a
    word."""
    check_forced_on_gpu(monkeypatch, "LOOSE_WORD", mode, lambda cfg: cfg.data["loose"] == 1,
                        shape, perm, dtype, op, rng)


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["0", "32", "64"])
@pytest.mark.parametrize("shape, perm, dtype, op", [
    ((3, 132, 142), (0, 2, 1), "bfloat16", "transpose_add"),  # 8-byte words, 284-byte output rows
    ((97, 70), (1, 0), "float32", "permute"),                  # plain tile, 388-byte rows
    ((2, 68, 132), (0, 2, 1), "int8", "permute"),              # quads, 68-byte rows
    ((36, 3, 70), (2, 1, 0), "float16", "transpose_add"),      # a misaligned batch stride
    ((6, 7, 40), (2, 1, 0), "float32", "permute"),             # split B (7 x 6), 168-byte rows
])
def test_cuda_shifted_tile(shape, perm, dtype, op, mode, rng, monkeypatch):
    """The shifted tile forced to each unit (ALIGN_OUT; "0" is the plain tile) on misaligned rows."""
    check_forced_on_gpu(monkeypatch, "ALIGN_OUT", mode, lambda cfg: cfg.variant.startswith("tiled"),
                        shape, perm, dtype, op, rng)


@pytest.mark.cuda
@pytest.mark.parametrize("shape, perm, dtype, op", [
    ((3, 70, 37), (0, 2, 1), "float32", "permute"),
    ((2, 64, 96), (0, 2, 1), "float16", "permute"),
    ((136, 68), (1, 0), "int8", "permute"),
    ((6, 5, 4), (1, 0, 2), "float32", "permute"),
    ((3, 66, 34), (0, 2, 1), "bfloat16", "transpose_add"),
    ((6, 5, 3), (1, 0, 2), "float16", "transpose_add"),
    ((4, 5), (0, 1), "float32", "transpose_add"),
    ((3, 37, 20, 16), (0, 2, 1, 3), "float32", "permute"),
    ((40, 33, 8), (1, 0, 2), "float32", "transpose_add"),
])
def test_cuda_int64_index_kernels(shape, perm, dtype, op, rng):
    """The long long instantiations on small data (above 2^31 elements is too big for a test)."""
    jt.flags.use_cuda = 1
    try:
        cfg = dataclasses.replace(P.select_config(shape, perm, dtype, op), index_type="long long")
        x = random_array(shape, dtype, rng)
        inputs = [to_var(x, dtype)]
        want = np.transpose(x, perm)
        if op == "transpose_add":
            y = random_array(want.shape, dtype, rng)
            inputs.append(to_var(y, dtype))
            d0, d1 = [k for k, p in enumerate(perm) if k != p] or [0, 0]
            want = add_reference(x, y, d0, d1, dtype)
        got = to_np(P.run_config(cfg, inputs).reshape(want.shape))
        if op == "transpose_add":
            assert_close_add(got, want, dtype)
        else:
            np.testing.assert_array_equal(got, want)
    finally:
        jt.flags.use_cuda = 0


# ---- nvcc: every menu compiles for sm_90 -------------------------------------------------------------------

def test_every_configuration_is_in_its_menu():
    """Each configuration the dispatcher picks (select table, case table) is an entry of its translation unit's
    menu, whose entries cover every template axis: ranks, chunks, packs, units, split B, loose words, groups."""
    from ops.scoring import fam_permute as FP
    cfgs = [P.select_config(s, p, d, op) for s, p, d, op, _ in SELECT_TABLE]
    cfgs += [P.select_config(c.shapes[0], FP._perm(c), c.dtype, c.p.get("op", "permute")) for c in FP.FAMILY.cases]
    for cfg in cfgs:
        if cfg.variant != "fallback":
            assert P._entry(cfg) in P.menu(cfg.op, _codegen.ITEMSIZE[cfg.dtype]), cfg
    kinds = {e[0] for op in P.VARIANTS for size in (1, 2, 4, 8, 16) for e in P.menu(op, size).entries}
    assert kinds == {"copy", "nd", "grouped", "tiled"}


# (op, dtype, index types) whose menus the nvcc test compiles: every element size of permute, transpose_add's
# arithmetic kinds (half, bfloat16 via float; float; bool as logical or); long long once (one nvcc minute each).
NVCC_MENUS = [("permute", "int8", ("int",)), ("permute", "float16", ("int",)), ("permute", "float32", ("long long",)),
              ("permute", "int64", ("int",)), ("transpose_add", "bfloat16", ("int",)),
              ("transpose_add", "float32", ("int",)), ("transpose_add", "bool", ("int",))]


@pytest.mark.nvcc
@pytest.mark.parametrize("op, dtype, index_types", NVCC_MENUS)
def test_nvcc_compiles_every_menu(op, dtype, index_types):
    from nvcc_util import compile_check
    ctype = _codegen.CTYPES[dtype]
    menu = P.menu(op, _codegen.ITEMSIZE[dtype])
    head = (f"template <typename T, typename I, class Map>\nvoid ops_{op}_menu(int v, const T* in0_p, "
            + ("const T* in1_p, " if op == "transpose_add" else "") + "T* out0_p, Map& data)")
    header = ("#include <string>\n#include <unordered_map>\n#include <iostream>\n#define LOGf std::cerr\n"
              + _codegen.header(["common", "permute"]) + menu.render(head, op))
    args = "0, x, y, x, data" if op == "transpose_add" else "0, x, x, data"
    body = (f"std::unordered_map<std::string, double> map;\nconst OpsData data(map);\n{ctype}* x = nullptr;\n"
            f"const {ctype}* y = nullptr;\n"
            + "\n".join(f"ops_{op}_menu<{ctype}, {it}>({args});" for it in index_types))
    ok, log = compile_check(header, body)
    assert ok, log[-4000:]


@pytest.mark.parametrize("op", ["permute", "transpose_add"])
def test_cpu_plans_carry_their_gradients_as_grad_sources(op, monkeypatch, rng):
    """On the CPU the launch holds dx (and transpose_add's dy) as grad sources, dx planned under '_' keys as the
    inverse permute of dout: no tape, and the gradients are the exact inverse permute (and dout)."""
    jt.flags.use_cuda = 0
    shape, perm = ((3, 5, 7), (2, 0, 1)) if op == "permute" else ((5, 7, 3), (1, 0, 2))
    cfg = P.select_config(shape, perm, "float32", op)
    launch = P.launch(cfg, False, shape, perm)
    out_shape = tuple(shape[p] for p in perm)
    want_grad = P.cpu_plan_data(out_shape, perm if op == "transpose_add" else tuple(np.argsort(perm)))
    assert launch.shapes == out_shape  # the Vars as they are: no reshape around the launch
    assert launch.kwargs["cpu_grad_src"][0] == P._CPU_GRAD_SRC
    assert len(launch.kwargs["cpu_grad_src"]) == (2 if op == "transpose_add" else 1)
    assert ops._launch.unpack_fields(launch.kwargs["data"], "_") == want_grad
    assert ops._launch.unpack_fields(launch.kwargs["data"]) == P.cpu_plan_data(shape, perm)
    assert len(launch.kwargs["data"]) == 2  # the forward's fields and the backward's, each in one entry
    lean = P.launch(cfg, False, shape, perm, need_grad=False)  # no backward to follow: no grad sources, no '_' keys
    assert "cpu_grad_src" not in lean.kwargs and not any(k.startswith("_") for k in lean.kwargs["data"])

    def no_tape(*args):
        raise AssertionError("a CPU plan went through the Python tape")

    monkeypatch.setattr(ops._launch, "taped", no_tape)
    x = jt.array(random_array(shape, "float32", rng))
    w = random_array(out_shape, "float32", rng)
    if op == "permute":
        y = ops.permute(x, perm)
        assert np.array_equal(jt.grad((y * jt.array(w)).sum(), x).numpy(), np.transpose(w, np.argsort(perm)))
    else:
        other = jt.array(random_array(out_shape, "float32", rng))
        y = ops.transpose_add(x, other, 0, 1)
        gx, gy = jt.grad((y * jt.array(w)).sum(), [x, other])
        assert np.array_equal(gx.numpy(), np.transpose(w, perm)) and np.array_equal(gy.numpy(), w)


def test_cpu_permute_of_ten_dims_goes_through_a_flat_launch(rng):
    """jittor's code op cannot take a 10-dim Var: past CODE_MAX_RANK dims the CPU launch is flat, with reshapes
    around it, values and gradient still exact."""
    jt.flags.use_cuda = 0
    shape, perm = (2, 1, 3, 1, 2, 1, 2, 1, 3, 2), (9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
    cfg = P.select_config(shape, perm, "float32", "permute")
    assert P.launch(cfg, False, shape, perm).shapes == (math.prod(shape),)
    a = random_array(shape, "float32", rng)
    x = jt.array(a)
    y = ops.permute(x, perm)
    assert np.array_equal(y.numpy(), np.transpose(a, perm))
    w = random_array(y.shape, "float32", rng)
    assert np.array_equal(jt.grad((y * jt.array(w)).sum(), x).numpy(), np.transpose(w, np.argsort(perm)))
