"""expand_as / broadcast_to: shape algebra, dispatch, values and gradients vs float64 NumPy, determinism, errors.

CPU compile budget: the forward has one CPU source (one compile per dtype), the backward one row and one column
source (one compile per (input dtype, output dtype) pair). The tests below stay near 25 distinct CPU kernels.
"""
import math

import numpy as np
import pytest

import ops
from ops import broadcast as B
from ops._jittor import jt
from ops.scoring import fam_broadcast
from ops.scoring.harness import InjectGrad
from ops.scoring.spec import random_array, round_to_bfloat16

ALL_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
              "float16", "bfloat16", "float32", "float64"]
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]
GRAD_TOL = {"float64": (1e-12, 1e-12), "float32": (1e-5, 1e-5), "float16": (2e-3, 2e-3),
            "bfloat16": (1e-2, 1e-2)}


# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------
def to_var(a: np.ndarray, dtype: str):
    """A Var of exactly ``dtype`` (jt.array alone turns float64 into float32 and int64/uint64 into int32)."""
    if dtype == "bfloat16":
        return jt.array(a.astype(np.float32)).cast("bfloat16")
    return jt.array(a, dtype=dtype)


def ref_grad(dy: np.ndarray, x_shape, out_shape) -> np.ndarray:
    lead = len(out_shape) - len(x_shape)
    padded = (1,) * lead + tuple(x_shape)
    axes = tuple(d for d, (a, b) in enumerate(zip(padded, out_shape)) if d < lead or (a == 1 and b != 1))
    return dy.astype(np.float64).sum(axis=axes).reshape(x_shape)


def vjp(y, x, dy):
    """dx for the output gradient dy (jittor 1.3.11's jt.grad takes none: d/dy of sum(y * dy) is exactly dy)."""
    return jt.grad((y * dy).sum(), x)


def grad_of(x_shape, out_shape, dtype, rng, dy=None):
    """(dx from ops, float64 reference dx) for a fresh random x and dy."""
    x = to_var(random_array(x_shape, dtype, rng), dtype)
    if dy is None:
        dy = random_array(out_shape, dtype, rng)
    y = ops.broadcast_to(x, out_shape)
    dx = vjp(y, x, to_var(dy, dtype))
    return dx, ref_grad(dy, x_shape, out_shape)


def assert_close(got, ref, rtol, atol, what=""):
    got = np.asarray(got, dtype=np.float64)
    if not np.allclose(got, ref, rtol=rtol, atol=atol):
        err = np.abs(got - ref) - atol - rtol * np.abs(ref)
        i = np.unravel_index(np.argmax(err), err.shape) if err.ndim else ()
        raise AssertionError(f"{what}: mismatch at {i}: got {got[i]!r}, want {ref[i]!r} (rtol={rtol}, atol={atol})")


def check_forward(x_shape, target, dtype, rng):
    a = random_array(x_shape, dtype, rng)
    x = to_var(a, dtype)
    assert str(x.dtype) == dtype
    y = ops.broadcast_to(x, target)
    assert str(y.dtype) == dtype
    want = np.broadcast_to(a, B.broadcast_shape(tuple(x_shape), tuple(target)))
    got = y.numpy()
    assert tuple(y.shape) == want.shape
    np.testing.assert_array_equal(got, want.astype(got.dtype))


# ---------------------------------------------------------------------------------------------------------------
# shape algebra
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x_shape,target,want", [
    ((3, 1), (3, 5), (3, 5)),
    ((1,), (4, 2, 7), (4, 2, 7)),
    ((2, 1, 4), (5, 2, 3, 4), (5, 2, 3, 4)),
    ((2, 1, 4), (5, -1, 3, -1), (5, 2, 3, 4)),
    ((2, 3), (2, 3), (2, 3)),
    ((1, 3), (0, 3), (0, 3)),
    ((0, 3), (2, 0, 3), (2, 0, 3)),
    ((1,), (), None),  # fewer dims than x: error
])
def test_broadcast_shape(x_shape, target, want):
    if want is None:
        with pytest.raises(ValueError, match=r"x of shape \(1,\).*shape \(\)"):
            B.broadcast_shape(x_shape, target)
        return
    assert B.broadcast_shape(x_shape, target) == want
    if -1 not in target:
        assert want == np.broadcast_shapes(x_shape, target)


@pytest.mark.parametrize("x_shape,target,pattern", [
    ((3, 2), (4, 3), r"dimension 0 of shape is 4 but x has 3"),
    ((3,), (2, 4), r"dimension 1 of shape is 4 but x has 3"),
    ((3,), (-1, 3), r"shape\[0\] = -1"),
    ((3,), (-2,), r"shape\[0\] = -2 is negative"),
    ((0,), (1,), r"dimension 0 of shape is 1 but x has 0"),
])
def test_broadcast_shape_errors_name_both_shapes(x_shape, target, pattern):
    with pytest.raises(ValueError, match=pattern) as info:
        B.broadcast_shape(x_shape, target)
    msg = str(info.value)
    assert f"x of shape {B._fmt(x_shape)}" in msg and f"to shape {B._fmt(target)}" in msg


@pytest.mark.parametrize("x_shape,out_shape,dims,kinds", [
    ((3, 1), (3, 5), (3, 5), (False, True)),
    ((1, 4), (6, 4), (6, 4), (True, False)),
    ((4,), (6, 4), (6, 4), (True, False)),
    ((2, 1, 3), (2, 5, 3), (2, 5, 3), (False, True, False)),
    ((1, 1, 3), (4, 5, 3), (20, 3), (True, False)),           # neighbouring broadcast dims merge
    ((2, 3, 1, 1), (2, 3, 4, 5), (6, 20), (False, True)),     # kept dims merge too
    ((1, 2, 1, 3), (1, 2, 1, 3), (6,), (False,)),             # size-1 output dims are dropped
    ((1, 2, 1, 3), (7, 2, 1, 3), (7, 6), (True, False)),      # ... also between kept dims
    ((1,), (1, 1), (1,), (False,)),                           # one element
    ((1,), (9,), (9,), (True,)),
    ((3, 1, 4, 1), (3, 2, 4, 5), (3, 2, 4, 5), (False, True, False, True)),
    ((1, 3, 1, 4, 1), (2, 3, 2, 4, 2), (2, 3, 2, 4, 2), (True, False, True, False, True)),
    ((1, 3), (0, 3), (0,), (False,)),
])
def test_simplify_broadcast(x_shape, out_shape, dims, kinds):
    assert B.simplify_broadcast(x_shape, out_shape) == (dims, kinds)


def _fwd_offsets(cfg):
    """The source offset of every output element, by the decomposition ops_bcast_src_offset performs."""
    e = np.arange(cfg.numel, dtype=np.int64)
    off = np.zeros_like(e)
    for n, s in zip(reversed(cfg.dims), reversed(cfg.in_strides)):
        off += (e % n) * s
        e //= n
    return off


@pytest.mark.parametrize("x_shape,out_shape", [
    ((3, 1), (3, 5)), ((1, 4), (6, 4)), ((2, 1, 3), (2, 5, 3)), ((1, 3, 1, 4, 1), (2, 3, 2, 4, 2)),
    ((3, 1, 2, 1, 2, 1), (3, 2, 2, 3, 2, 2)), ((1,), (9,)), ((5,), (5,)), ((1,), (1, 1)), ((2, 1), (4, 2, 3)),
])
def test_forward_config_index_math(x_shape, out_shape):
    """dims/in_strides (padded to a compiled group count) address x exactly as NumPy's broadcast does."""
    cfg = B.select_config(x_shape, out_shape, "float32")
    assert cfg.nd in B.FWD_ND_BUCKETS and math.prod(cfg.dims) == cfg.numel == math.prod(out_shape)
    x = np.arange(math.prod(x_shape)).reshape(x_shape)
    np.testing.assert_array_equal(x.reshape(-1)[_fwd_offsets(cfg)], np.broadcast_to(x, out_shape).reshape(-1))
    # every element written once: full vectors of blocks * BLOCK * UNROLL, then the tail in block 0
    nvec = cfg.numel // cfg.vec
    assert cfg.grid * cfg.block * cfg.unroll >= nvec and cfg.numel - nvec * cfg.vec < cfg.block
    assert cfg.grid == 1 or (cfg.grid - 1) * cfg.block * cfg.unroll < nvec


def _emulate_forward_kernel(cfg, x_flat):
    """ops_bcast_fwd_kernel vector by vector (which path, which source elements), in NumPy; returns the output
    and how many vectors took each path."""
    offsets = _fwd_offsets(cfg)
    inner, vec = cfg.dims[-1], cfg.vec
    out = np.empty(cfg.numel, dtype=x_flat.dtype)
    paths = {"whole": 0, "split": 0, "elements": 0}
    for v in range(cfg.numel // vec):
        e0 = v * vec
        off, c = offsets[e0], e0 % inner
        if c + vec <= inner:
            paths["whole"] += 1
            out[e0:e0 + vec] = x_flat[off] if cfg.inner_bcast else x_flat[off:off + vec]
        elif inner >= vec:
            paths["split"] += 1
            split = inner - c
            off2 = offsets[e0 + split]
            for k in range(vec):
                if cfg.inner_bcast:
                    out[e0 + k] = x_flat[off] if k < split else x_flat[off2]
                else:
                    out[e0 + k] = x_flat[off + k] if k < split else x_flat[off2 + k - split]
        else:
            paths["elements"] += 1
            out[e0:e0 + vec] = x_flat[offsets[e0:e0 + vec]]
    tail = cfg.numel // vec * vec
    out[tail:] = x_flat[offsets[tail:]]
    return out, paths


@pytest.mark.parametrize("x_shape,out_shape,dtype", [
    ((32, 807, 1), (32, 807, 807), "float16"), ((5, 1), (5, 13), "float32"), ((1, 13), (3, 13), "int8"),
    ((3, 1, 9), (3, 4, 9), "float16"), ((2, 1, 3), (2, 5, 3), "float64"), ((7, 1), (7, 10), "bool"),
])
def test_forward_kernel_vectors_across_run_boundaries(x_shape, out_shape, dtype):
    """The kernel's three per-vector paths (whole run, two runs, element by element) give NumPy's broadcast."""
    cfg = B.select_config(x_shape, out_shape, dtype)
    x = np.arange(math.prod(x_shape), dtype=np.int64)
    got, paths = _emulate_forward_kernel(cfg, x)
    np.testing.assert_array_equal(got, np.broadcast_to(x.reshape(x_shape), out_shape).reshape(-1))
    if cfg.dims[-1] >= cfg.vec and cfg.dims[-1] % cfg.vec:
        assert paths["split"] > 0  # the two-run path is exercised


# ---------------------------------------------------------------------------------------------------------------
# dispatch tables
# ---------------------------------------------------------------------------------------------------------------
FWD_TABLE = [
    ((1785, 1), (1785, 128), "float32", "fill"),
    ((32, 807, 1), (32, 807, 807), "float16", "fill"),
    ((1,), (8192, 8192), "float32", "fill"),
    ((1, 8192), (8192, 8192), "float32", "tile"),
    ((7,), (7,), "int8", "tile"),
    ((64, 1, 1024), (64, 1024, 1024), "float32", "nd"),
    ((1, 256, 1), (64, 256, 1024), "float32", "nd"),
    ((1, 3, 1, 4, 1), (2, 3, 2, 4, 2), "bool", "nd"),
]

GRAD_TABLE = [
    ((5, 6), (5, 6), "float32", "identity"),
    ((1,), (40,), "float16", "row_small"),                     # 40 fp16 = 5 chunks
    ((8, 1), (8, 32), "float32", "row_small"),                 # 8 chunks
    ((1785, 1), (1785, 128), "float32", "row_warp"),
    ((32, 807, 1), (32, 807, 807), "float32", "row_warp"),
    ((32, 807, 1), (32, 807, 807), "float16", "row_warp"),
    ((5, 1, 1), (5, 128, 128), "float32", "row_block"),
    ((8192, 1), (8192, 8192), "float32", "row_block"),
    ((16, 1, 1), (16, 807, 807), "float32", "row_split"),
    ((32, 1, 1), (32, 256, 256), "float32", "row_split"),
    ((1,), (8192, 8192), "float32", "row_split"),
    ((1, 8), (100, 8), "float64", "col"),
    ((64, 1, 1024), (64, 100, 1024), "float16", "col"),
    ((1, 8192), (8192, 8192), "float32", "col_split+col"),
    ((64, 1, 1024), (64, 1024, 1024), "float32", "col"),
    ((64, 1, 1024), (64, 1024, 1024), "float16", "col_split+col"),
    ((1, 64, 1), (32, 64, 4096), "float32", "row_block+col"),
    ((1, 64, 1), (32, 64, 4096), "float16", "row_warp+col"),
    ((3, 1, 4, 1), (3, 5, 4, 6), "bfloat16", "row_small+col"),
]


@pytest.mark.parametrize("x_shape,out_shape,dtype,variant", FWD_TABLE)
def test_select_config_table(x_shape, out_shape, dtype, variant):
    assert B.select_config(x_shape, out_shape, dtype).variant == variant


@pytest.mark.parametrize("x_shape,out_shape,dtype,variant", GRAD_TABLE)
def test_select_grad_config_table(x_shape, out_shape, dtype, variant):
    assert B.select_grad_config(x_shape, out_shape, dtype).variant == variant


def test_every_variant_is_picked():
    assert {v for *_, v in FWD_TABLE} == set(B.FORWARD_VARIANTS)
    picked = {name for *_, v in GRAD_TABLE for name in v.split("+")}
    assert picked == set(B.GRAD_VARIANTS)


def test_index_type_switches_above_int32():
    small = B.select_config((1, 1024), (2**21 - 1, 1024), "int8")
    big = B.select_config((1, 1024), (2**21, 1024), "int8")
    assert (small.index_type, big.index_type) == ("int", "long long")
    g = B.select_grad_config((1, 1024), (2**21, 1024), "float16")
    assert g.passes[0].index_type == "long long" and g.passes[-1].index_type == "int"
    assert B.select_config((3, 1), (3, 4), "float32", index_type="long long").index_type == "long long"


def _emulate(cfg: "B.GradConfig", dy: np.ndarray, x_shape):
    """Run a reduction chain in float64 NumPy, segment by segment, with the launch shapes of each pass."""
    v = dy.astype(np.float64).reshape(-1)
    for p in cfg.passes:
        if p.kind in ("row", "row_split"):
            a = v.reshape(p.outer, p.red)
            v = np.stack([a[:, s * p.seg_len:(s + 1) * p.seg_len].sum(1) for s in range(p.segments)], 1)
            if p.kind == "row_split":
                v = v.sum(1)
        else:
            a = v.reshape(p.outer, p.red, p.inner)
            v = np.stack([a[:, s * p.seg_len:(s + 1) * p.seg_len].sum(1) for s in range(p.segments)], 1)
        v = v.reshape(-1)
    return v.reshape(x_shape)


@pytest.mark.parametrize("x_shape,out_shape,dtype", [
    (x, o, d) for x, o, d, _ in GRAD_TABLE if math.prod(o) <= 2**22] + [
    ((1, 2), (100000, 2), "float32"), ((4, 1), (100000, 4, 2), "float16"), ((1, 7, 1, 3), (300, 7, 50, 3), "float32"),
])
def test_grad_plan_is_consistent(x_shape, out_shape, dtype, rng):
    """Chains: shapes and dtypes line up, segments are non-empty, grids cover every task, and the chain (run
    in NumPy) computes the reference sum."""
    cfg = B.select_grad_config(x_shape, out_shape, dtype)
    numel, cur = math.prod(out_shape), dtype
    for k, p in enumerate(cfg.passes):
        assert p.outer * p.red * p.inner == numel and p.in_dtype == cur
        assert (p.segments - 1) * p.seg_len < p.red <= p.segments * p.seg_len
        if p.kind == "row":
            assert p.grid * (B.BLOCK // p.group) >= p.outer * p.segments and p.segments == 1
        elif p.kind == "row_split":
            assert p.grid == p.outer * p.segments and p.segments >= 2 and p.outer <= B.SPLIT_MAX_ROWS
            assert p.group == 256 and p.seg_len % (16 // B.ITEMSIZE[p.in_dtype]) == 0
        else:
            vec = 16 // B.ITEMSIZE[p.in_dtype]
            assert p.tiles * B.COL_COL_THREADS * vec >= p.inner and p.grid == p.tiles * p.outer * p.segments
        numel, cur = p.out_numel, p.out_dtype
        if k < len(cfg.passes) - 1:
            assert p.out_dtype == B.ACC_DTYPE[dtype]
    assert numel == math.prod(x_shape) and cur == dtype
    dy = rng.uniform(-1, 1, out_shape)
    np.testing.assert_allclose(_emulate(cfg, dy, x_shape), ref_grad(dy, x_shape, out_shape), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("mis", range(8))
@pytest.mark.parametrize("lo,hi,group", [(0, 807, 32), (3, 40, 4), (5, 9, 4), (0, 3, 32), (100, 5000, 256)])
def test_row_partition_covers_segment(mis, lo, hi, group):
    """The row kernel's head / 16-byte chunks / tail split of [lo, hi) for every misalignment (fp16: VEC = 8),
    as written in ops_bcast_row_reduce_kernel, visits every element exactly once."""
    vec = 8
    head = min((vec - mis) if mis else 0, hi - lo)
    a = lo + head
    nv = (hi - a) // vec
    b = a + nv * vec
    seen = []
    for lane in range(group):
        seen += list(range(lo + lane, a, group))
        seen += [a + k * vec + i for k in range(lane, nv, group) for i in range(vec)]
        seen += list(range(b + lane, hi, group))
    assert sorted(seen) == list(range(lo, hi))


# ---------------------------------------------------------------------------------------------------------------
# values on the device (CPU always; CUDA under -m cuda)
# ---------------------------------------------------------------------------------------------------------------
_DTYPE_SHAPES = [((3, 1), (3, 37)), ((1, 5), (9, 5)), ((2, 1, 3), (2, 4, 3))]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_forward_every_dtype(device, dtype, rng):
    x_shape, target = _DTYPE_SHAPES[ALL_DTYPES.index(dtype) % len(_DTYPE_SHAPES)]
    check_forward(x_shape, target, dtype, rng)


@pytest.mark.parametrize("x_shape,target", [
    ((1785, 1), (1785, 128)),            # fill
    ((7, 1), (7, 13)),                   # fill, rows not a multiple of the vector
    ((1,), (1001,)),                     # fill, scalar
    ((1, 129), (3, 129)),                # tile, odd row
    ((64,), (5, 64)),                    # tile, leading dim added
    ((3,), (3,)),                        # tile: a copy
    ((2, 1, 3), (2, 50, 3)),             # nd, small inner run
    ((1, 33, 1), (3, 33, 17)),           # nd, broadcast at both ends
    ((1, 3, 1, 4, 1), (2, 3, 2, 4, 2)),  # nd, 5 groups (10-group kernel)
    ((2, 1, 3, 1, 2, 1, 2), (2, 2, 3, 2, 2, 3, 2)),
    ((1,), (1, 1)),                      # one element
    ((2, 3), (4, -1, -1)),               # -1 keeps x's size
])
def test_forward_shapes(device, x_shape, target, rng):
    check_forward(x_shape, target, "float32", rng)


def test_forward_empty_outputs(device):
    for x_shape, target in [((1, 3), (0, 3)), ((0, 3), (2, 0, 3)), ((1,), (4, 0))]:
        y = ops.broadcast_to(jt.zeros(x_shape, "float32"), target)
        assert y.numpy().shape == B.broadcast_shape(x_shape, target)
    x = jt.array(np.ones((1, 3), np.float32))
    assert jt.grad(ops.broadcast_to(x, (0, 3)).sum() + x.sum(), x).numpy().tolist() == [[1, 1, 1]]


def test_expand_as_and_module(device, rng):
    a = random_array((4, 1, 3), "float32", rng)
    other = jt.zeros((2, 4, 5, 3), "float32")
    want = np.broadcast_to(a, (2, 4, 5, 3))
    np.testing.assert_array_equal(ops.expand_as(jt.array(a), other).numpy(), want)
    np.testing.assert_array_equal(ops.ExpandAs()(jt.array(a), other).numpy(), want)


def test_forward_without_grad_tape(device, rng):
    a = random_array((3, 1), "float32", rng)
    x = jt.array(a).stop_grad()
    np.testing.assert_array_equal(ops.broadcast_to(x, (3, 6)).numpy(), np.broadcast_to(a, (3, 6)))
    with jt.no_grad():
        np.testing.assert_array_equal(ops.broadcast_to(jt.array(a), (2, 3, 6)).numpy(), np.broadcast_to(a, (2, 3, 6)))


# gradients: every pass kind, float dtypes
_GRAD_CASES = [
    ((5, 6), (5, 6), "float32"),                   # identity
    ((7, 1), (7, 9), "float32"),                   # row_small
    ((45, 1), (45, 807), "float32"),               # row_warp
    ((3, 1), (3, 5000), "float32"),                # row_block
    ((2, 1, 1), (2, 300, 100), "float32"),         # row_split
    ((1, 8), (100, 8), "float32"),                 # col
    ((2, 1, 9), (2, 1500, 9), "float32"),          # col_split + col
    ((1, 6, 1), (5, 6, 7), "float32"),             # row_small + col
    ((3, 1, 4, 1), (3, 5, 4, 6), "float32"),       # two broadcast groups
    ((4, 1), (3, 4, 5), "float32"),                # leading dim added
    ((1,), (5000,), "float16"),                    # row_block
    ((2, 1), (2, 40000), "float16"),               # row_split (f16 -> f32 partials -> f16)
    ((1, 4, 1), (3, 4, 70000), "float32"),         # row_split (f32 out, kept for a pass) + col
    ((1, 8), (1000, 8), "float16"),                # col_split (f16 -> f32 -> f16)
    ((45, 1), (45, 807), "float16"),               # row_warp
    ((45, 1), (45, 807), "bfloat16"),              # row_warp
    ((1, 6, 1), (5, 6, 7), "bfloat16"),            # row_small + col (bf16 -> f32 -> bf16)
    ((45, 1), (45, 807), "float64"),               # row_warp
    ((2, 1, 9), (2, 30, 9), "float64"),            # col
    ((1, 3, 1, 8), (2, 3, 5000, 8), "float32"),    # CPU: blocks of 4096 rows, summed twice over the leading dim
    ((1, 1, 100), (2, 4097, 100), "float16"),      # CPU: rows of 100 through the scratch row, two blocks
]


@pytest.mark.parametrize("x_shape,out_shape,dtype", _GRAD_CASES)
def test_grad_values(device, x_shape, out_shape, dtype, rng):
    dx, ref = grad_of(x_shape, out_shape, dtype, rng)
    assert tuple(dx.shape) == tuple(x_shape) and str(dx.dtype) == dtype
    rtol, atol = GRAD_TOL[dtype]
    red = math.prod(out_shape) // math.prod(x_shape)
    atol = max(atol, 4 * red * (2.0 ** -53 if dtype == "float64" else 2.0 ** -24))
    assert_close(dx.numpy(), ref, rtol, atol, f"grad {x_shape}->{out_shape} {dtype}")


def test_grad_half_accumulates_in_float32(device):
    """4096 ones summed: a float16 accumulator would stall at 2048, a float32 one reaches 4096 exactly."""
    for dtype in ("float16", "bfloat16"):
        x = jt.ones((1,), dtype)
        dx = vjp(ops.broadcast_to(x, (4096,)), x, jt.ones((4096,), dtype))
        assert float(dx.numpy()[0]) == 4096.0


# Every kind of reduction pass, for bfloat16.
BF16_PASSES = [((4, 1), (4, 300), "row_warp"), ((3, 1), (3, 20), "row_small"), ((2, 1), (2, 40000), "row_split"),
               ((1, 5), (100, 5), "col"), ((1, 5), (300, 5), "col_split+col"), ((1, 6, 1), (5, 6, 7), "row_small+col")]


@pytest.mark.parametrize("x_shape,out_shape,variant", BF16_PASSES)
def test_grad_bfloat16_is_the_exact_sum_rounded(device, x_shape, out_shape, variant, rng):
    """dy on a 2^-6 grid keeps every float32 sum exact: dx must be that sum rounded to bfloat16, ties to even
    (as PyTorch and the GPU's __float2bfloat16_rn do; jittor's CPU conversion truncates)."""
    assert B.select_grad_config(x_shape, out_shape, "bfloat16").variant == variant
    dy = rng.integers(-64, 65, size=out_shape) / 64.0
    x = to_var(random_array(x_shape, "bfloat16", rng), "bfloat16")
    dx = vjp(ops.broadcast_to(x, out_shape), x, to_var(dy, "bfloat16"))
    assert str(dx.dtype) == "bfloat16"
    exact = ref_grad(dy, x_shape, out_shape)
    assert np.array_equal(exact.astype(np.float32), exact), "the grid keeps float32 sums exact"
    assert np.array_equal(dx.float32().numpy(), round_to_bfloat16(exact.astype(np.float32)))


@pytest.mark.parametrize("x_shape,out_shape,variant", BF16_PASSES)
def test_grad_bfloat16_rounds_up_where_truncation_would_not(device, x_shape, out_shape, variant, rng):
    """A tie case in every pass: 1 + 0.005859375 (3/4 of a bfloat16 ulp above 1) rounds to 1.0078125;
    truncation gives 1.0. One random sign per dx element, the two values at random places of its sum."""
    x = to_var(random_array(x_shape, "bfloat16", rng), "bfloat16")
    lead = len(out_shape) - len(x_shape)
    padded = (1,) * lead + tuple(x_shape)
    index = np.indices(out_shape)  # owner: the dx element (flat) each dy element is summed into
    owner = np.ravel_multi_index(tuple(index[d] if padded[d] != 1 else 0 * index[d] for d in range(len(out_shape))),
                                 padded).reshape(-1)
    sign = rng.choice([-1.0, 1.0], size=math.prod(x_shape))
    dy = np.zeros(math.prod(out_shape))
    for e in range(math.prod(x_shape)):
        first, second = rng.choice(np.flatnonzero(owner == e), 2, replace=False)
        dy[first], dy[second] = sign[e], sign[e] * 0.005859375
    dx = vjp(ops.broadcast_to(x, out_shape), x, to_var(dy.reshape(out_shape), "bfloat16"))
    assert np.array_equal(dx.float32().numpy().reshape(-1), sign * 1.0078125)


@pytest.mark.parametrize("out_shape", [(2, 3), (4, 2, 3)])
def test_grad_of_another_dtype_is_rounded_to_bfloat16(device, out_shape, rng):
    """An output gradient in float32 for a bfloat16 x (a custom backward may pass one): dx is rounded to nearest
    even, also where nothing is summed (jittor's CPU cast would truncate 1.005859375 to 1.0)."""
    x = to_var(random_array((2, 3), "bfloat16", rng), "bfloat16")
    reps = math.prod(out_shape) // 6
    dy = np.full(out_shape, 1.005859375, np.float32)
    dx = jt.grad(InjectGrad.apply(ops.broadcast_to(x, out_shape), jt.array(dy)).sum(), x)
    assert str(dx.dtype) == "bfloat16"
    np.testing.assert_array_equal(dx.float32().numpy(), round_to_bfloat16(np.full((2, 3), reps * 1.005859375,
                                                                                  np.float32)))
    assert float(dx.float32().numpy()[0, 0]) != reps  # truncation would give this


@pytest.mark.parametrize("x_shape,out_shape,dtype", [
    ((2, 1, 1), (2, 300, 100), "float32"), ((2, 1, 9), (2, 1500, 9), "float16"), ((1, 6, 1), (5, 6, 7), "float32"),
])
def test_grad_deterministic(device, x_shape, out_shape, dtype, rng):
    x = to_var(random_array(x_shape, dtype, rng), dtype)
    dy = to_var(random_array(out_shape, dtype, rng), dtype)
    runs = [vjp(ops.broadcast_to(x, out_shape), x, dy).numpy() for _ in range(2)]
    assert runs[0].tobytes() == runs[1].tobytes()


def test_grad_int_input_is_not_differentiated(device):
    y = ops.broadcast_to(jt.array(np.arange(3, dtype=np.int32).reshape(3, 1)), (3, 2))
    assert y.numpy().tolist() == [[0, 0], [1, 1], [2, 2]]


def test_shape_takes_jittor_shapes_and_index_ints(device, rng):
    """x.shape is jittor's NanoVector; entries may be anything operator.index takes, or a one-element integer
    Var (as PyTorch takes 0-d integer tensors)."""
    x_np = random_array((2, 3), "float32", rng)
    x, other = to_var(x_np, "float32"), jt.zeros((4, 2, 3), "float32")
    want = np.broadcast_to(x_np, (4, 2, 3))
    assert type(other.shape).__name__ == "NanoVector"
    for shape in (other.shape, [np.int64(4), np.int32(2), 3], (jt.array(4), 2, jt.array([3], "int64")),
                  np.array([4, 2, 3])):
        y = ops.broadcast_to(x, shape)
        assert tuple(y.shape) == (4, 2, 3)
        np.testing.assert_array_equal(y.numpy(), want)
    assert tuple(ops.broadcast_to(jt.zeros((1,), "float32"), np.int64(5)).shape) == (5,)


def test_ten_dims_and_no_more(device, rng):
    """jittor Vars hold at most 10 dims (NanoVector); past that, a ValueError naming shape, not jittor's check."""
    x_np = random_array((3, 1), "float32", rng)
    shape = (2, 1, 2, 1, 2, 1, 2, 1, 3, 2)
    x = to_var(x_np, "float32")
    y = ops.broadcast_to(x, shape)
    assert tuple(y.shape) == shape
    np.testing.assert_array_equal(y.numpy(), np.broadcast_to(x_np, shape))
    w = random_array(shape, "float32", rng)  # the gradient of a launch on flat Vars (its groups in data)
    dx = jt.grad((y * jt.array(w)).sum(), x).numpy().astype(np.float64)
    groups = w.astype(np.float64).reshape(-1, 3, 2)
    want = groups.sum(axis=(0, 2))[:, None]
    # A float32 sum of 32 terms errs by at most 32 units of rounding of the sum of their magnitudes (a relative
    # tolerance alone fails where the terms cancel)
    bound = 32 * 2.0 ** -24 * np.abs(groups).sum(axis=(0, 2))[:, None]
    np.testing.assert_array_less(np.abs(dx - want), bound)
    with pytest.raises(ValueError, match="shape has 11 dims; jittor Vars have at most 10"):
        ops.broadcast_to(to_var(x_np, "float32"), (1,) + shape)


# ---------------------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------------------
def test_errors_name_the_argument():
    x = jt.zeros((3, 2), "float32")
    with pytest.raises(TypeError, match="x must be a jittor Var"):
        ops.broadcast_to(np.zeros((3, 2)), (3, 2))
    with pytest.raises(TypeError, match="x must be a jittor Var"):
        ops.expand_as([1, 2], x)
    with pytest.raises(TypeError, match="other must be a jittor Var"):
        ops.expand_as(x, (3, 2))
    with pytest.raises(TypeError, match=r"shape\[1\] must be an int"):
        ops.broadcast_to(x, (3, 2.0))
    with pytest.raises(TypeError, match=r"shape\[0\] must be an int"):
        ops.broadcast_to(x, (True, 3, 2))
    with pytest.raises(TypeError, match="shape must be a sequence of ints"):
        ops.broadcast_to(x, "3,2")
    with pytest.raises(TypeError, match="shape must be a sequence of ints, got a jittor Var"):
        ops.broadcast_to(x, jt.zeros((4, 3, 2), "float32"))
    with pytest.raises(TypeError, match=r"shape\[0\] must be an int, got a jittor Var of dtype int32 and shape \(2,\)"):
        ops.broadcast_to(x, (jt.array([4, 1]), 3, 2))
    with pytest.raises(TypeError, match=r"shape\[1\] must be an int, got a jittor Var of dtype float32"):
        ops.broadcast_to(x, (4, jt.array(3.0), 2))
    with pytest.raises(ValueError, match=r"x of shape \(3, 2\) to shape \(4, 2\)"):
        ops.broadcast_to(x, (4, 2))
    with pytest.raises(ValueError, match=r"x of shape \(3, 2\) to other's shape \(3, 5\)"):
        ops.expand_as(x, jt.zeros((3, 5), "float32"))
    with pytest.raises(ValueError, match=r"x of shape \(3, 2\) to shape \(2,\): shape has fewer dimensions"):
        ops.broadcast_to(x, 2)


# ---------------------------------------------------------------------------------------------------------------
# the grader's CPU cases (guards the case table)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("c", [c for c in fam_broadcast.FAMILY.cases if "cpu" in c.devices], ids=lambda c: c.id)
def test_family_cpu_cases(c, rng):
    fam = fam_broadcast.FAMILY
    arrays = fam.make_inputs(c, rng)
    xs = [to_var(a, c.dtype) for a in arrays]
    rtol, atol = fam.tolerance(c)
    variant = fam.variant(c, ops)
    if c.direction == "fwd":
        assert variant in B.FORWARD_VARIANTS
    else:
        assert set(variant.split("+")) <= set(B.GRAD_VARIANTS)
    out = fam.forward(c, ops, xs)[0]
    assert_close(out.numpy(), fam.reference_forward(c, arrays)[0], rtol, atol, c.id)
    if c.direction == "bwd":
        dy = random_array(c.p["out"], c.dtype, rng)
        dx = vjp(out, xs[0], to_var(dy, c.dtype))
        assert_close(dx.numpy(), fam.reference_backward(c, arrays, [dy])[0], rtol, atol, c.id)


# ---------------------------------------------------------------------------------------------------------------
# CUDA-only: the GPU-sized dispatch paths, misaligned inputs, the int64 index path
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("x_shape,out_shape,dtype", [
    ((32, 807, 1), (32, 807, 807), "float16"),      # fill (unaligned rows) / row_warp
    ((16, 1, 1), (16, 807, 807), "float32"),        # fill / row_split
    ((1, 8192), (4096, 8192), "float32"),           # tile (16-byte loads) / col_split
    ((64, 1, 1024), (64, 512, 1024), "float16"),    # nd / col_split
    ((1, 256, 1), (16, 256, 1024), "float32"),      # nd / row_block + col
    ((1,), (2**24 + 3,), "float32"),                # fill scalar / row_split, with a tail
])
def test_cuda_large(x_shape, out_shape, dtype, rng):
    prev = jt.flags.use_cuda
    jt.flags.use_cuda = 1
    try:
        check_forward(x_shape, out_shape, dtype, rng)
        dx, ref = grad_of(x_shape, out_shape, dtype, rng)
        red = math.prod(out_shape) // math.prod(x_shape)
        rtol, atol = GRAD_TOL[dtype]
        assert_close(dx.numpy(), ref, rtol, max(atol, 4 * red * 2.0 ** -24), f"{x_shape}->{out_shape}")
    finally:
        jt.flags.use_cuda = prev


@pytest.mark.cuda
def test_cuda_split_rows_are_deterministic(rng):
    """The one-launch split pass: whichever block of a row finishes last adds the partials in the same order,
    and it resets the row's counter, so every launch (same shape or another) is right and bit-identical."""
    prev = jt.flags.use_cuda
    jt.flags.use_cuda = 1
    try:
        for x_shape, out_shape in [((16, 1, 1), (16, 807, 807)), ((1,), (3 * 2**20 + 5,)), ((3, 1), (3, 300001))]:
            assert B.select_grad_config(x_shape, out_shape, "float32").variant == "row_split"
            x = jt.zeros(x_shape, "float32")
            dy_np = rng.uniform(-1, 1, out_shape).astype(np.float32)
            dy = jt.array(dy_np)
            runs = [vjp(ops.broadcast_to(x, out_shape), x, dy).numpy() for _ in range(5)]
            assert all(r.tobytes() == runs[0].tobytes() for r in runs[1:]), f"{out_shape}: runs differ"
            red = math.prod(out_shape) // math.prod(x_shape)
            assert_close(runs[0], ref_grad(dy_np, x_shape, out_shape), 1e-5, 4 * red * 2.0 ** -24, f"{out_shape}")
    finally:
        jt.flags.use_cuda = prev


def test_split_counter_array_matches_python():
    assert f"#define OPS_BCAST_SPLIT_MAX_ROWS {B.SPLIT_MAX_ROWS}\n" in B._codegen.snippet("broadcast")
    assert B.TARGET_BLOCKS <= B.SPLIT_MAX_ROWS


def test_misaligned_input_views(device, rng):
    """Slices that jittor shares with a 4-byte offset: the forward's 16-byte loads fall back to element loads,
    the row reduction gets a head and a tail in every row, the column reduction takes its element path."""
    base = rng.uniform(-1, 1, (3 * 1024 + 1,)).astype(np.float32)
    x = jt.array(base)[1:1025]
    np.testing.assert_array_equal(ops.broadcast_to(x, (3, 1024)).numpy(), np.broadcast_to(base[1:1025], (3, 1024)))
    dy = jt.array(base)[1:].reshape((3, 1024))
    want = base[1:].astype(np.float64).reshape(3, 1024)
    for x_shape, axis in [((1, 1024), 0), ((3, 1), 1)]:
        xx = jt.zeros(x_shape, "float32")
        dx = vjp(ops.broadcast_to(xx, (3, 1024)), xx, dy)
        assert_close(dx.numpy(), want.sum(axis, keepdims=True), 1e-5, 1e-5, f"view grad {x_shape}")


@pytest.mark.cuda
def test_cuda_int64_index_path(rng):
    """The long long instantiations on a small case (the automatic choice needs > 2^31 elements)."""
    prev = jt.flags.use_cuda
    jt.flags.use_cuda = 1
    try:
        a = random_array((3, 1, 5), "float32", rng)
        cfg = B.select_config((3, 1, 5), (3, 7, 5), "float32", index_type="long long")
        y = B.forward_launch(cfg, "float32", True, (3, 7, 5))([jt.array(a)])
        np.testing.assert_array_equal(y.numpy(), np.broadcast_to(a, (3, 7, 5)))
        for x_shape, out_shape in [((3, 1), (3, 5000)), ((1, 8), (1000, 8)), ((2, 1, 1), (2, 300, 100))]:
            g = B.select_grad_config(x_shape, out_shape, "float32", index_type="long long")
            dy = rng.uniform(-1, 1, out_shape).astype(np.float32)
            v = jt.array(dy).reshape((dy.size,))
            for p in g.passes:
                out = B.pass_launch(p, True)([v])
                v = out[0] if p.kind == "row_split" else out
            dx = v.reshape(x_shape)
            assert_close(dx.numpy(), ref_grad(dy, x_shape, out_shape), 1e-5, 1e-4, f"int64 {x_shape}")
    finally:
        jt.flags.use_cuda = prev


@pytest.mark.parametrize("x_shape,out_shape,dtype", [
    ((1, 8), (1000, 8), "float32"), ((1, 5), (300, 5), "float16"), ((2, 1, 100), (2, 300, 100), "float32"),
    ((3, 1), (3, 5000), "float32"), ((1, 6, 1), (5, 6, 7), "bfloat16")])
def test_cpu_reduction_passes(x_shape, out_shape, dtype, rng):
    """The CPU launches of the GPU's reduction passes (row, row_split, column: what cast_rounded and tools run
    on the CPU) give the gradient, each column summed in order (cpu sum_columns)."""
    jt.flags.use_cuda = 0
    g = B.select_grad_config(x_shape, out_shape, dtype)
    dy = random_array(out_shape, dtype, rng)
    v = to_var(dy, dtype).reshape((dy.size,))
    for p in g.passes:
        out = B.pass_launch(p, False)([v])
        v = out[0] if p.kind == "row_split" else out
    rtol, atol = GRAD_TOL[dtype]
    red = math.prod(out_shape) // math.prod(x_shape)
    assert_close(v.reshape(x_shape).numpy().astype(np.float64), ref_grad(dy.astype(np.float64), x_shape, out_shape),
                 rtol, max(atol, 4 * red * 2.0 ** -24), f"cpu passes {x_shape}->{out_shape} {dtype}")


# ---------------------------------------------------------------------------------------------------------------
# nvcc: every kernel instantiation compiles for sm_90 (one nvcc run)
# ---------------------------------------------------------------------------------------------------------------
def _instantiations():
    body = []
    for t in ("uint8_t", "uint16_t", "uint32_t", "uint64_t"):  # the forward moves bytes: one type per size
        for it in ("int", "long long"):
            body.append(f"ops_bcast_forward_menu<{t}, {it}>(0, ({t}*)0, ({t}*)0, 0, data);")
    pairs = []  # (dy or partial type, output type, accumulator): every pair a chain can produce
    for dt, acc in B.ACC_DTYPE.items():
        ct, ca = B._codegen.CTYPES[dt], B._ACC_CTYPE[acc]
        pairs += [(ct, ct, ca)] + ([(ct, ca, ca), (ca, ct, ca)] if dt != acc else [])
    pairs.append(("float", "float", "float"))
    for src, dst, acc in sorted(set(pairs)):
        for it in ("int", "long long"):
            body.append(f"ops_bcast_pass_menu<{src}, {dst}, {acc}, {it}>(0, ({src}*)0, ({dst}*)0, data);")
            body.append(f"ops_bcast_row_split<{src}, {dst}, {acc}, {it}>(({src}*)0, ({dst}*)0, ({acc}*)0, 1, 1, 1, 1);")
    return "std::unordered_map<std::string, double> map;\nconst OpsData data(map);\n" + "\n".join(body)


@pytest.mark.nvcc
def test_nvcc_compiles_every_instantiation():
    from nvcc_util import compile_check
    header = ("#include <unordered_map>\n#include <iostream>\n#define LOGf std::cerr\n"
              + B._codegen.header(["common", "broadcast"])
              + B.FWD_MENU.render("template <typename T, typename I, class Map>\n"
                                  "void ops_bcast_forward_menu(int v, const T* in, T* out, long long numel, Map& data)",
                                  "forward")
              + B.PASS_MENU.render("template <typename T, typename OutT, typename A, typename I, class Map>\n"
                                   "void ops_bcast_pass_menu(int v, const T* in, OutT* out, Map& data)", "pass"))
    ok, log = compile_check(header, _instantiations())
    assert ok, log[-6000:]


def test_cpu_backward_is_the_grad_source_of_the_forward(monkeypatch, rng):
    """On the CPU the forward launch holds the backward (one pass over dout) as its grad source, for the float
    dtypes only: no tape; a kept inner dim under a broadcast one sums its rows in order in float32 (as jittor's
    sum and the GPU passes do), bit for bit."""
    jt.flags.use_cuda = 0
    cfg = B.select_config((8, 1, 256), (8, 128, 256), "float32")
    assert B.forward_launch(cfg, "float32", False, (8, 128, 256)).kwargs["cpu_grad_src"] == [B._CPU_GRAD]
    icfg = B.select_config((8, 1, 256), (8, 128, 256), "int32")
    assert "cpu_grad_src" not in B.forward_launch(icfg, "int32", False, (8, 128, 256)).kwargs
    assert "cpu_grad_src" not in B.forward_launch(cfg, "float32", False, (8, 128, 256), need_grad=False).kwargs

    def no_tape(*args):
        raise AssertionError("a CPU plan went through the Python tape")

    monkeypatch.setattr(ops._launch, "taped", no_tape)
    x = jt.array(random_array((8, 1, 256), "float32", rng))
    w = random_array((8, 128, 256), "float32", rng)
    got = jt.grad((ops.broadcast_to(x, (8, 128, 256)) * jt.array(w)).sum(), x).numpy()
    want = np.zeros((8, 1, 256), np.float32)
    for m in range(128):  # float32 adds, row after row
        want[:, 0] += w[:, m]
    assert np.array_equal(got, want)
    exact = w.astype(np.float64).sum(axis=1, keepdims=True)
    assert np.abs(got - exact).max() <= 1e-5 * np.abs(w).sum(axis=1).max()


@pytest.mark.parametrize("x_shape, out_shape", [((1,), (37, 23)), ((37, 1), (37, 23)), ((1, 23), (37, 23)),
                                                ((5, 1, 7), (3, 5, 11, 7)), ((1, 4, 1), (9, 4, 6)), ((), ())])
def test_the_graders_backward_sums_in_blocks(x_shape, out_shape, rng, monkeypatch):
    """The grader's float64 reference of the backward (sums over the broadcast axes and the 2-norms of their
    finite terms), computed over blocks of dy's first axis: the whole-array sums, NaN and infinities included."""
    monkeypatch.setattr(fam_broadcast, "SUM_BLOCK_ELEMENTS", 40)
    g = rng.standard_normal(out_shape).astype(np.float32)
    if g.size > 8:
        g.flat[[1, 5, 8]] = [np.nan, np.inf, -np.inf]
    axes = fam_broadcast._reduce_axes(x_shape, out_shape)
    sums, l2 = fam_broadcast.reference_sums(g, axes)
    g64 = g.astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = g64.sum(axis=axes, keepdims=True)
    finite = np.where(np.isfinite(g64), g64, 0.0)
    np.testing.assert_allclose(sums, want, rtol=1e-12, atol=1e-12)
    assert np.array_equal(np.isnan(sums), np.isnan(want)) and np.array_equal(np.isinf(sums), np.isinf(want))
    np.testing.assert_allclose(l2, np.sqrt((finite * finite).sum(axis=axes, keepdims=True)), rtol=1e-12)
