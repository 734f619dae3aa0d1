"""The CPU path's own code (cuda_snippets/*_cpu.h): the branch-free float16/bfloat16 conversions against NumPy,
each max_pool3d CPU code path (separable passes, compile-time W windows, flat and per-row H pass, stack and
thread scratch, packed and wide geometry) against the float64 reference with ties, signed zeros and NaN, and
the backward from saved indices against the GPU's gather index math run on the CPU, bit for bit."""
import re

import numpy as np
import pytest

import ops
from ops import _codegen
from ops import permutation as PM
from ops import pool3d as P
from ops._jittor import jt
from ops.scoring import fam_pool3d as F
from ops.scoring.harness import InjectGrad, to_numpy64
from ops.scoring.harness import to_jittor as _to_jittor
from ops.scoring.spec import random_array, round_to_bfloat16

DTYPES = ["float32", "float16", "bfloat16", "float64"]


@pytest.fixture(autouse=True)
def on_cpu():
    previous = jt.flags.use_cuda
    jt.flags.use_cuda = 0
    yield
    jt.flags.use_cuda = previous


def to_jittor(a, dtype):
    return jt.array(a, dtype="float64") if dtype == "float64" else _to_jittor(a, dtype)


def _kw(k, s=None, p=0, d=1, ceil=False):
    return dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)


# ---- cpu_common.h: conversions ----------------------------------------------------------------------------

_CONVERT_HEADER = _codegen.include(("cpu_common.h",))


def _convert(src, x, out_dtype):
    return jt.code(x.shape, out_dtype, [x], cpu_header=_CONVERT_HEADER, cpu_src=src).numpy()


def test_half_to_float_is_exact_for_every_bit_pattern():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.int32)
    src = ("for (int i = 0; i < in0_shape0; ++i) "
           "out0_p[i] = ops_cpu::half_bits_to_float((uint16_t)in0_p[i]);")
    got = _convert(src, jt.array(bits), "float32")
    want = bits.astype(np.uint16).view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))  # signed zeros too


def _edge_floats(rng):
    """Random floats over the half range and beyond, plus the rounding edges: halfway cases between halves
    (normal and subnormal), the overflow threshold, the smallest subnormal's half, zeros, infinities."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = halves[np.isfinite(halves)].astype(np.float32)
    finite.sort()
    mid = (finite[:-1].astype(np.float64) + finite[1:]) / 2  # exact ties in float32 (halves have 11 bits)
    special = np.array([65504, 65519.99, 65520, 65536, 1e6, 2 ** -25, 2 ** -24, 2 ** -25 * 1.0001, 3 * 2 ** -26,
                        0.0, -0.0, np.inf, -np.inf, 1e-30, -1e-30], np.float64)
    rand = np.concatenate([rng.uniform(-70000, 70000, 20000), rng.uniform(-1e-4, 1e-4, 20000),
                           rng.standard_normal(20000)])
    return np.concatenate([finite, mid, -mid, special, rand]).astype(np.float32)


def test_float_to_half_rounds_to_nearest_even(rng):
    x = _edge_floats(rng)
    src = ("for (int i = 0; i < in0_shape0; ++i) "
           "out0_p[i] = (int)ops_cpu::float_to_half_bits(in0_p[i]);")
    got = _convert(src, jt.array(x), "int32").astype(np.uint16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)  # NumPy rounds to nearest even
    np.testing.assert_array_equal(got, want)
    nan = _convert(src, jt.array(np.array([np.nan, -np.nan], np.float32)), "int32").astype(np.uint16)
    assert np.isnan(nan.view(np.float16)).all()


def test_float_to_bfloat16_rounds_to_nearest_even(rng):
    x = np.concatenate([rng.standard_normal(50000).astype(np.float32),
                        (rng.integers(0, 1 << 32, 50000, dtype=np.uint64).astype(np.uint32)).view(np.float32)])
    x = x[np.isfinite(x)]
    src = ("for (int i = 0; i < in0_shape0; ++i) "
           "out0_p[i] = (int)ops_cpu::float_to_bfloat_bits(in0_p[i]);")
    got = _convert(src, jt.array(x), "int32").astype(np.uint32) << 16
    np.testing.assert_array_equal(got.view(np.float32), round_to_bfloat16(x))


# ---- max_pool3d forward: every CPU code path --------------------------------------------------------------

# (shape, parameters, what it exercises)
FORWARD_PATHS = [
    ((2, 3, 8, 10, 12), _kw(2), "W pass (2, 2), per-row H"),
    ((2, 3, 9, 9, 9), _kw(3, 1), "W pass (3, 1), flat H"),
    ((2, 4, 9, 12, 11), _kw(3, 2, 1), "W pass (3, 2), padding: pads in the slab"),
    ((2, 2, 9, 9, 12), _kw(3, 3), "W pass (3, 3)"),
    ((2, 2, 5, 6, 7), _kw((2, 2, 2), 1), "W pass (2, 1), flat H"),
    ((2, 2, 5, 6, 7), _kw((2, 3, 1), (1, 1, 1), (1, 1, 0)), "W pass (1, 1), flat H with padding"),
    ((2, 3, 8, 9, 16), _kw(4, 4), "generic W pass"),
    ((2, 3, 10, 11, 12), _kw((1, 3, 2), (1, 2, 3), (0, 1, 1), (1, 2, 1)), "dilation, generic W pass"),
    ((2, 2, 9, 10, 13), _kw(3, 2, 1, 2), "dilation in every dim"),
    ((2, 3, 7, 9, 11), _kw(3, 2, ceil=True), "ceil_mode: columns past the edge"),
    ((1, 2, 12, 12, 12), _kw(8, 1), "big window"),
    ((1, 1, 4, 4, 4), _kw(2), "tiny"),
    ((1, 2, 5, 40, 44), _kw(3, 2, 1), "thread scratch (the slab exceeds the stack buffer)"),
    ((1, 2, 3, 5, 40), _kw((1, 2, 17), (1, 1, 3)), "wide geometry (a parameter of 16 or more)"),
    ((2, 3, 6, 7, 8), _kw((2, 3, 3), (2, 1, 1)), "flat H, W pass (3, 1)"),
]


def _tricky(shape, dtype, rng):
    """Few distinct values (ties everywhere), signed zeros, NaN and infinities."""
    x = rng.integers(-2, 3, size=shape).astype(np.float32) * 0.5
    flat = x.reshape(-1)
    n = flat.size
    flat[rng.choice(n, max(1, n // 50), replace=False)] = np.nan
    flat[rng.choice(n, max(1, n // 50), replace=False)] = -np.nan
    flat[rng.choice(n, max(1, n // 40), replace=False)] = -0.0
    flat[rng.choice(n, max(1, n // 60), replace=False)] = -np.inf
    flat[rng.choice(n, max(1, n // 80), replace=False)] = np.inf
    return x.astype(np.float64) if dtype == "float64" else x


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_paths_match_the_reference(dtype, rng):
    xs = [_tricky(shape, dtype, rng) for shape, _, _ in FORWARD_PATHS]
    both = [ops.max_pool3d(to_jittor(x, dtype), return_indices=True, **kw) for x, (_, kw, _) in zip(xs, FORWARD_PATHS)]
    with jt.no_grad():
        values = [ops.max_pool3d(to_jittor(x, dtype), **kw) for x, (_, kw, _) in zip(xs, FORWARD_PATHS)]
    jt.sync([v for pair in both for v in pair] + values)
    for x, (shape, kw, what), (y, idx), v in zip(xs, FORWARD_PATHS, both, values):
        want, want_idx = F.reference_pool(x, **kw)
        for got in (to_numpy64(y), to_numpy64(v)):
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
            np.testing.assert_array_equal(np.nan_to_num(got), np.nan_to_num(want), err_msg=what)
        np.testing.assert_array_equal(idx.numpy(), want_idx, err_msg=what)  # first maximum, last NaN


@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_of_short_rows_matches_the_reference(dtype, rng):
    """Rows shorter than 8 with 2x2x2 / 3x3x3 windows at stride >= 2: planes without NaN take the window scan,
    planes with one the key passes (both in one batch)."""
    for shape, kw in [((3, 2, 4, 4, 4), _kw(2)), ((2, 3, 6, 7, 7), _kw(3, 2)), ((2, 2, 6, 6, 6), _kw(3, 3)),
                      ((2, 2, 5, 7, 5), _kw(2, (2, 3, 2)))]:
        x = rng.integers(-2, 3, size=shape).astype(np.float32) * 0.5  # ties everywhere
        x[0, 0].reshape(-1)[rng.choice(x[0, 0].size, 2, replace=False)] = np.nan  # one plane with NaN
        x[-1, -1].reshape(-1)[rng.choice(x[-1, -1].size, 3, replace=False)] = -np.inf
        x[-1, 0].reshape(-1)[:5] = -0.0
        x = x.astype(np.float64) if dtype == "float64" else x
        y, idx = ops.max_pool3d(to_jittor(x, dtype), return_indices=True, **kw)
        with jt.no_grad():
            v = ops.max_pool3d(to_jittor(x, dtype), **kw)
        want, want_idx = F.reference_pool(x, **kw)
        for got in (to_numpy64(y), to_numpy64(v)):
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=str((shape, kw)))
            np.testing.assert_array_equal(np.nan_to_num(got), np.nan_to_num(want), err_msg=str((shape, kw)))
        np.testing.assert_array_equal(idx.numpy(), want_idx, err_msg=str((shape, kw)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_keep_the_first_zero_with_its_sign(dtype, rng):
    """Windows whose maximum is a zero: the first zero in scan order, its sign kept, on every CPU path (passes
    with keys, the window scan of short rows, with and without indices)."""
    for shape, kw in [((2, 3, 6, 9, 12), _kw(2)), ((2, 2, 5, 9, 11), _kw(3, 1)), ((1, 2, 6, 6, 6), _kw(3, 2, 1)),
                      ((2, 2, 4, 4, 4), _kw(2)), ((1, 2, 9, 10, 13), _kw(3, 2, 1, 2))]:
        x = rng.choice(np.array([-0.0, 0.0, -1.0, -2.0], np.float32), size=shape)
        x = x.astype(np.float64) if dtype == "float64" else x
        with jt.no_grad():
            v = to_numpy64(ops.max_pool3d(to_jittor(x, dtype), **kw))
        y, _ = ops.max_pool3d(to_jittor(x, dtype), return_indices=True, **kw)
        want, _ = F.reference_pool(x, **kw)
        for got in (v, to_numpy64(y)):
            np.testing.assert_array_equal(got, want, err_msg=str((shape, kw)))
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=str((shape, kw)))


def test_signed_zero_ties_keep_the_first_index():
    x = np.array([-0.0, 0.0, 0.0, -0.0], np.float32).reshape(1, 1, 1, 1, 4)
    _, idx = ops.max_pool3d(jt.array(x), (1, 1, 2), return_indices=True)
    assert idx.numpy().reshape(-1).tolist() == [0, 2]


def test_geometry_data_is_one_entry_for_small_windows():
    assert list(P.cpu_geometry_data(P.normalize_params(3, 2, 1))) == ["g"]
    wide = P.cpu_geometry_data(P.normalize_params((1, 2, 17), (1, 1, 3)))
    assert wide["g"] == -1 and set(wide) == {"g", "gk", "gs", "gp", "gd"}
    with pytest.raises(ValueError, match="below"):
        P.cpu_geometry_data(P.normalize_params((1, 1, 1 << 17)))


# ---- max_pool3d backward: the GPU's gather, run on the CPU, gives the same dx bit for bit ------------------

# The CUDA gather's work items (pool3d_gather.cuh: runs of RUN elements of an input row, loaded the LOADS way) one
# after another, reading the indices the forward saved: the GPU's index math and summation order on the CPU.
_GATHER_HEADER = r"""
#include <algorithm>
template <int LOADS, int RUN, typename A, class Win, typename T, class Load>
void gather_items(const Win& win, const Pool3dGatherDims& gd, const int* idx, const T* dy, T* dx, long long planes,
                  int D, long long plane_out, Load load) {
  const long long plane_in = (long long)D * gd.H * gd.W;
  for (long long p = 0; p < planes; ++p)
    for (int id = 0; id < D; ++id)
      for (int ih = 0; ih < gd.H; ++ih)
        for (int w0 = 0; w0 < gd.W; w0 += RUN) {
          const int n = std::min(RUN, gd.W - w0);
          A acc[RUN];
          Pool3dGatherBy<LOADS>::run(win, gd, idx + p * plane_out, dy + p * plane_out, id, ih, w0, n, acc, load,
                                     Pool3dPlaneRows{gd.Ho, gd.Wo});
          T* dp = dx + p * plane_in + ((long long)id * gd.H + ih) * gd.W + w0;
          for (int r = 0; r < n; ++r) dp[r] = ops_cpu::from_acc<T>(acc[r]);
        }
}
// The block form's work items (pool3d_gather_block_reach): a run of each row of a block of RD x RH rows (id + i * dd,
// ih + k * dh), the blocks along D and H in turn, as the GPU numbers them.
template <int RD, int RH, int RUN, typename A, class Win, typename T, class Load>
void gather_blocks(const Win& win, const Pool3dGatherDims& gd, const int* idx, const T* dy, T* dx, long long planes,
                   int D, long long plane_out, Load load) {
  const long long plane_in = (long long)D * gd.H * gd.W;
  for (long long p = 0; p < planes; ++p)
    for (int group_d = 0; group_d < pool3d_groups(D, RD, Win::dd); ++group_d)
      for (int group_h = 0; group_h < pool3d_groups(gd.H, RH, Win::dh); ++group_h)
        for (int w0 = 0; w0 < gd.W; w0 += RUN) {
          const int id = pool3d_group_row(group_d, RD, Win::dd), ih = pool3d_group_row(group_h, RH, Win::dh);
          if (id >= D || ih >= gd.H) continue;
          const int nd = pool3d_group_rows(id, D, RD, Win::dd), nh = pool3d_group_rows(ih, gd.H, RH, Win::dh);
          const int n = std::min(RUN, gd.W - w0);
          A acc[RD * RH][RUN];
          pool3d_gather_block_reach<RD, RH>(win, gd, idx + p * plane_out, dy + p * plane_out, id, ih, nd, nh, w0, n,
                                            acc, load, Pool3dPlaneRows{gd.Ho, gd.Wo});
          for (int i = 0; i < nd; ++i)
            for (int k = 0; k < nh; ++k) {
              T* dp = dx + p * plane_in + ((long long)(id + i * Win::dd) * gd.H + ih + k * Win::dh) * gd.W + w0;
              for (int r = 0; r < n; ++r) dp[r] = ops_cpu::from_acc<T>(acc[i * RH + k][r]);
            }
        }
}
"""
# The sources' common opening: the accumulator, dy's load and the launch's sizes.
_GATHER_OPEN = r"""
typedef ops_cpu::Acc<in0_type>::type A;
struct Load { A operator()(const in0_type* p) const { return ops_cpu::to_acc(*p); } };
const Pool3dGatherDims gd = {(int)in0_shape3, (int)in0_shape4, (int)in1_shape2, (int)in1_shape3, (int)in1_shape4,
                             (int)data["pd"], (int)data["ph"], (int)data["pw"]};
const long long planes = (long long)in0_shape0 * in0_shape1;
const long long plane_out = (long long)in1_shape2 * in1_shape3 * in1_shape4;
"""
# On demand, the window at run time (as every layer outside GATHER_WINDOWS runs on the GPU).
_GATHER_SRC = _GATHER_OPEN + r"""
const Pool3dWinR win = {(int)data["kd"], (int)data["kh"], (int)data["kw"], (int)data["sd"], (int)data["sh"],
                        (int)data["sw"], (int)data["dd"], (int)data["dh"], (int)data["dw"]};
gather_items<POOL3D_LOADS_ON_DEMAND, 4, A>(win, gd, (const int*)in2_p, in1_p, out0_p, planes, (int)in0_shape2,
                                           plane_out, Load());
"""


def _gather_header():
    return _GATHER_HEADER.replace("#include <algorithm>\n", "#include <algorithm>\n"
                                  + _codegen.include(("cpu_common.h", "pool3d_gather")) + "\n")


def _gather_on_cpu(x, dy, idx, params):
    return jt.code(x.shape, x.dtype, [x, dy, idx], cpu_header=_gather_header(), cpu_src=_GATHER_SRC,
                   data=P.PoolParams.data(params))


GRADIENT_PATHS = [
    ((2, 3, 9, 9, 9), _kw(3, 1)),  # overlapping: sums
    ((2, 4, 9, 12, 11), _kw(3, 2, 1)),  # overlapping with padding
    ((1, 2, 12, 12, 12), _kw(8, 1)),  # up to 512 windows per element
    ((2, 3, 10, 11, 12), _kw((1, 3, 2), (1, 2, 1), (0, 1, 1), (1, 2, 1))),  # dilation
    ((2, 3, 8, 10, 12), _kw(2)),  # disjoint: a copy
    ((2, 3, 8, 9, 11), _kw(2, 3)),  # disjoint with gaps
    ((2, 3, 7, 9, 11), _kw(2, ceil=True)),  # partial windows
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_from_indices_is_the_gather_bit_for_bit(dtype, rng):
    for shape, kw in GRADIENT_PATHS:
        x = to_jittor(random_array(shape, dtype, rng), dtype)
        y, idx = ops.max_pool3d(x, return_indices=True, **kw)
        dy = to_jittor(random_array(tuple(y.shape), dtype, rng), dtype)
        got = jt.grad(InjectGrad.apply(ops.max_pool3d(x, **kw), dy).sum(), x)
        want = _gather_on_cpu(x, dy, idx, P.normalize_params(**kw))
        assert got.numpy().tobytes() == want.numpy().tobytes(), (shape, kw)
        again = jt.grad(InjectGrad.apply(ops.max_pool3d(x, **kw), dy).sum(), x)
        assert again.numpy().tobytes() == got.numpy().tobytes(), (shape, kw)


# The CUDA gather's other ways of loading (Pool3dGatherBy: a row's indices and dy read before any test, the rows
# unrolled or not, each window compared with the elements it reaches) for each compile-time window that takes one on
# the GPU (ops/pool3d.py: GATHER_LOADS), every form that applies and two run lengths, as work items one after
# another: each must give the on-demand gather's dx bit for bit.
_LOADED_SRC = _GATHER_OPEN + r"""
switch ((int)data["case"]) {
@CASES
}
"""
# The block forms (pool3d_gather_block_reach with RD x RH rows a thread).
BLOCK_FORMS = ("REACH rows 1x2", "REACH rows 2x1", "REACH rows 2x2", "REACH rows 4x1")
LOADED_FORMS = [(window, loads, run) for window in P.GATHER_LOADS
                for loads in ("POOL3D_LOADS_ROW", "POOL3D_LOADS_ALL", "POOL3D_LOADS_REACH") + BLOCK_FORMS
                if "REACH" not in loads or window[1] == (1, 1, 1) for run in (4, 8)]


def _loaded_src():
    cases = []
    for i, (window, loads, run) in enumerate(LOADED_FORMS):
        win = "Pool3dWinC<" + ", ".join(str(v) for t in window for v in t) + ">"
        if loads in BLOCK_FORMS:
            items = f"gather_blocks<{loads[len('REACH rows '):].replace('x', ', ')}, {run}, A>"
        else:
            items = f"gather_items<{loads}, {run}, A>"
        cases.append(f"case {i}: {items}({win}(), gd, (const int*)in2_p, in1_p, out0_p, "
                     f"planes, (int)in0_shape2, plane_out, Load()); break;")
    return _LOADED_SRC.replace("@CASES", "\n".join(cases))


def _loaded_paths(window):
    """Layers of one compile-time window: whole runs, a partial last run, and padding or ceil_mode where they fit."""
    k, s, d = window
    kw = lambda **extra: dict(kernel_size=k, stride=s, dilation=d, **extra)  # noqa: E731
    return [((2, 3, 9, 10, 16), kw()), ((1, 2, 7, 9, 11), kw()),
            ((2, 2, 8, 11, 13), kw(padding=tuple(0 if kk == 1 else 1 for kk in k))),
            ((1, 3, 7, 9, 13), kw(ceil_mode=True))] + _narrow_paths(window)


def _narrow_paths(window):
    """Stride-1 layers whose output rows hold (kw - 1) * dw windows, or one more: a REACH run's windows then run
    past both ends of a row, which the work item's mask of the windows inside a row must leave out."""
    k, s, d = window
    ew = (k[2] - 1) * d[2]
    if s != (1, 1, 1) or ew == 0:
        return []
    kw = dict(kernel_size=k, stride=s, dilation=d)
    return [((2, 2, 7, 8, 2 * ew), kw), ((2, 2, 7, 8, 2 * ew + 1), kw)]


# How often the work items of a launch (pool3d_groups groups, rows from pool3d_group_row and pool3d_group_rows) take
# each row of a dim of n rows, for groups of R rows dl apart; and whether groups of one row are the rows themselves
# (a one-row kernel takes the group's number for its row).
_GROUPS_SRC = r"""
const int Rs[3] = {1, 2, 4};
for (int a = 0; a < 3; ++a)
  for (int dl = 1; dl <= 3; ++dl)
    for (int n = 1; n <= 12; ++n) {
      int* taken = out0_p + ((a * 3 + dl - 1) * 12 + n - 1) * 13;
      for (int p = 0; p < pool3d_groups(n, Rs[a], dl); ++p) {
        const int t = pool3d_group_row(p, Rs[a], dl);
        if (t >= n) continue;
        for (int i = 0; i < pool3d_group_rows(t, n, Rs[a], dl); ++i) taken[t + i * dl] += 1;
        if (Rs[a] == 1 && t != p) taken[12] = 1;
      }
      if (Rs[a] == 1 && pool3d_groups(n, 1, dl) != n) taken[12] = 1;
    }
"""


def test_groups_of_rows_take_every_row_once():
    header = "#include <algorithm>\n" + _codegen.include(("cpu_common.h", "pool3d_gather"))
    out = jt.code((3, 3, 12, 13), "int32", [], cpu_header=header, cpu_src="memset(out0_p, 0, out0->size);\n"
                  + _GROUPS_SRC).numpy()
    for n in range(1, 13):
        assert (out[:, :, n - 1, :n] == 1).all(), n  # every row once
        assert (out[:, :, n - 1, n:12] == 0).all(), n  # no row past the dim
    assert (out[:, :, :, 12] == 0).all()  # one-row groups are the rows


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loaded_gathers_are_the_gather_bit_for_bit(dtype, rng):
    header, src = _gather_header(), _loaded_src()
    for i, (window, loads, run) in enumerate(LOADED_FORMS):
        for shape, kw in _loaded_paths(window):
            x = random_array(shape, dtype, rng)
            x.reshape(-1)[::7] = x.reshape(-1)[3]  # ties
            x = to_jittor(x, dtype)
            y, idx = ops.max_pool3d(x, return_indices=True, **kw)
            dy = to_jittor(random_array(tuple(y.shape), dtype, rng), dtype)
            data = dict(P.PoolParams.data(P.normalize_params(**kw)), case=i)
            got = jt.code(x.shape, x.dtype, [x, dy, idx], cpu_header=header, cpu_src=src, data=data)
            want = jt.grad(InjectGrad.apply(ops.max_pool3d(x, **kw), dy).sum(), x)
            assert got.numpy().tobytes() == want.numpy().tobytes(), (window, loads, run, shape, kw)


# The CUDA bwd_disjoint's work items (pool3d_gather.cuh: VEC consecutive elements of the flattened planes, which
# cross rows and planes where W is not a multiple of VEC) one after another.
_DISJOINT_SRC = r"""
const int VEC = @VEC;
struct { int D, H, W, Do, Ho, Wo, kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw; } geom = {
    (int)in0_shape2, (int)in0_shape3, (int)in0_shape4, (int)in1_shape2, (int)in1_shape3, (int)in1_shape4,
    (int)data["kd"], (int)data["kh"], (int)data["kw"], (int)data["sd"], (int)data["sh"], (int)data["sw"],
    (int)data["pd"], (int)data["ph"], (int)data["pw"], (int)data["dd"], (int)data["dh"], (int)data["dw"]};
const Pool3dDisjoint g = pool3d_disjoint_dims(geom);  // the launcher's dims, from the same fields
const long long total = (long long)in0_shape0 * in0_shape1 * g.D * g.H * g.W;
const long long plane_out = (long long)g.Do * g.Ho * g.Wo;
for (long long e0 = 0; e0 < total; e0 += VEC) {
  const long long row = e0 / g.W, q = row / g.H;
  const int n = (int)std::min<long long>(VEC, total - e0);
  const in0_type zero = (in0_type)0.0f;
  in0_type out[VEC] = {@ZEROS};  // (jittor's host half types have no default constructor)
  pool3d_disjoint_run<in0_type, VEC, long long>(g, (const int*)in2_p, in1_p, plane_out, q / g.D, (int)(q % g.D),
                                                (int)(row % g.H), (int)(e0 % g.W), n, zero, out);
  for (int r = 0; r < n; ++r) out0_p[e0 + r] = out[r];
}
"""

DISJOINT_PATHS = [
    ((2, 3, 8, 9, 11), _kw(2, 3)),  # gaps; rows of 11: items cross rows and planes
    ((8, 2, 7, 9, 13), _kw(2, 3, ceil=True)),  # partial last windows
    ((2, 2, 10, 11, 13), _kw(2, 3, 1, ceil=True)),  # padding
    ((1, 3, 9, 10, 14), _kw((1, 2, 2), (2, 3, 4), (0, 1, 1), (1, 2, 2))),  # dilation: offsets 0 and 2 of 3 or 4
    ((2, 3, 8, 10, 12), _kw(2)),  # windows that tile x
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_disjoint_backward_is_the_cpu_paths_copy_bit_for_bit(dtype, rng):
    """dy's bits where an element is its window's argmax (ties, NaN and -0.0 in x and dy), +0 elsewhere."""
    header = _codegen.include(("cpu_common.h", "pool3d_gather"))
    for shape, kw in DISJOINT_PATHS:
        params = P.normalize_params(**kw)
        assert P.windows_disjoint(params), kw
        x = rng.choice(np.array([-0.0, 0.0, 1.0, np.nan, -np.inf], np.float32), size=shape)
        x = to_jittor(x, dtype) if rng.random() < 0.5 else to_jittor(random_array(shape, dtype, rng), dtype)
        y, idx = ops.max_pool3d(x, return_indices=True, **kw)
        dy = random_array(tuple(y.shape), dtype, rng)
        dy.reshape(-1)[::5] = -0.0
        dy = to_jittor(dy, dtype)
        vec = P.select_config(shape, dtype, params, "bwd", on_cuda=True).vec  # the GPU's items
        src = _DISJOINT_SRC.replace("@VEC", str(vec)).replace("@ZEROS", ", ".join(["zero"] * vec))
        got = jt.code(x.shape, x.dtype, [x, dy, idx], cpu_header="#include <algorithm>\n" + header,
                      cpu_src=src, data=P.PoolParams.data(params))
        want = jt.grad(InjectGrad.apply(ops.max_pool3d(x, **kw), dy).sum(), x)
        assert got.numpy().tobytes() == want.numpy().tobytes(), (shape, kw)


# ---- permute / transpose_add ------------------------------------------------------------------------------

def test_cpu_plan_modes():
    assert PM.cpu_plan_data((4, 5), (0, 1)) == {"m": 0}
    rows = PM.cpu_plan_data((64, 48, 16), (1, 0, 2))  # output rows of 16 elements, outer dims (48, 64)
    assert rows == {"m": 1, "r": 16, "k": 2, "A": 48, "I": 16, "B": 64, "J": 768}
    tiles = PM.cpu_plan_data((8, 96, 80), (0, 2, 1))  # the (96, 80) plane for each of 8 batch indices
    assert tiles == {"m": 2, "a": 80, "b": 96, "i": 80, "o": 96, "k": 1, "A": 8, "I": 7680, "Q": 7680}
    assert PM.cpu_plan_data((5, 6, 7, 8), (2, 3, 0, 1))["k"] == 0  # simplified to a (30, 56) transpose


def test_fields_travel_in_one_data_entry_and_read_back():
    """pack_fields puts the integer fields in one key (the others apart), under a prefix when given;
    read_fields (cpu_common.h) reads that key and one-character entries alike."""
    from ops._launch import pack_fields, unpack_fields
    fields = {"m": 2, "a": 56, "o": -30, "A": 2 ** 40, "e": 0.5}
    data = {**pack_fields(fields), **pack_fields({"m": 1, "r": 16}, "_")}
    assert len(data) == 3 and data["e"] == 0.5
    assert unpack_fields(data) == fields and unpack_fields(data, "_") == {"m": 1, "r": 16}
    for bad in ("ab", "7", "-", "#", "\u00e9"):
        with pytest.raises(ValueError, match="one printable ASCII character"):
            pack_fields({bad: 1})
    header = _codegen.include(("cpu_common.h",))
    src = ("auto f = ops_cpu::read_fields(data); auto g = ops_cpu::read_fields(data, '_');\n"
           "const char keys[] = {'m', 'a', 'o', 'A', 'e'};\n"
           "for (int i = 0; i < 5; ++i) out0_p[i] = f[keys[i]];\n"
           "out0_p[5] = g['m']; out0_p[6] = g['r'];")
    got = jt.code((7,), "float64", [jt.array(np.zeros(1, np.float32))], cpu_src=src, cpu_header=header,
                  data=data).numpy()
    np.testing.assert_array_equal(got, [2, 56, -30, 2 ** 40, 0.5, 1, 16])


@pytest.mark.parametrize("src, data, name", [
    ("out0_p[0] = ops_cpu::read_fields(data)['m'] + ops_cpu::read_fields(data)['z'];", {"m": 2}, "field 'z'"),
    ("out0_p[0] = ops_cpu::read_fields(data, '_')['m'];", {"m": 2}, "field 'm'"),  # not under the prefix
    ('out0_p[0] = ops_cpu::need(data, "gk");', {"g": -1, "gs": 3}, 'data["gk"]'),
])
def test_a_field_the_launch_did_not_pass_is_an_error_naming_it(src, data, name):
    """The CPU readers (cpu_common.h: read_fields, need) end the op naming what is missing, never read a 0."""
    from ops._launch import pack_fields
    packed = pack_fields(data) if "need" not in src else data
    with pytest.raises(RuntimeError, match=re.escape(name) + ", which its launch did not pass"):
        jt.code((1,), "float64", [jt.array(np.zeros(1, np.float32))], cpu_src=src,
                cpu_header=_codegen.include(("cpu_common.h",)), data=packed).numpy()


# Shapes for the tiles (blocks of 8 and 4, remainders, several tiles, batch dims), the rows (64-, 32-, 16-,
# 8-byte multiples and odd sizes) and the identity.
PERMUTE_PATHS = [
    ((67, 45), (1, 0)), ((3, 33, 70), (0, 2, 1)), ((2, 5, 3, 17, 9), (4, 2, 0, 3, 1)), ((7, 9), (1, 0)),
    ((5, 6, 7, 8), (2, 3, 0, 1)), ((64, 48, 16), (1, 0, 2)), ((4, 6, 8, 12), (0, 2, 1, 3)),
    ((3, 5, 4, 3), (1, 0, 2, 3)), ((2, 3, 2, 3, 2, 3, 2, 5), (7, 0, 6, 1, 5, 2, 4, 3)), ((6, 1, 5), (2, 1, 0)),
    ((12, 40), (0, 1)),
]
PERMUTE_DTYPES = ["bool", "int8", "float16", "bfloat16", "int32", "float32", "int64", "float64"]


def _values(shape, dtype, rng):
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-100, 100, size=shape).astype(dtype)
    return random_array(shape, dtype, rng)


@pytest.mark.parametrize("dtype", PERMUTE_DTYPES)
def test_permute_paths(dtype, rng):
    xs = [_values(shape, dtype, rng) for shape, _ in PERMUTE_PATHS]
    outs = [ops.permute(to_jittor(x, dtype), *perm) for x, (_, perm) in zip(xs, PERMUTE_PATHS)]
    jt.sync(outs)
    for x, (shape, perm), y in zip(xs, PERMUTE_PATHS, outs):
        np.testing.assert_array_equal(to_numpy64(y), np.transpose(x, perm).astype(to_numpy64(y).dtype),
                                      err_msg=str((shape, perm)))


def _round(v, dtype):
    if dtype == "float16":
        return v.astype(np.float32).astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        return round_to_bfloat16(v.astype(np.float32)).astype(np.float64)
    return v


@pytest.mark.parametrize("dtype", PERMUTE_DTYPES)
def test_transpose_add_paths(dtype, rng):
    for shape, d0, d1 in [((67, 45), 0, 1), ((3, 33, 70), 1, 2), ((4, 6, 8, 12), 1, 2), ((5, 6, 7), 0, 1),
                          ((12, 40), 1, 1), ((2, 9, 3, 40), 0, 3)]:
        perm = list(range(len(shape)))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        x = _values(shape, dtype, rng)
        y = _values(tuple(shape[p] for p in perm), dtype, rng)
        got = to_numpy64(ops.transpose_add(to_jittor(x, dtype), to_jittor(y, dtype), d0, d1))
        xt = np.transpose(x, perm)
        if dtype == "bool":
            want = xt | y
        elif dtype.startswith("int"):
            want = (xt + y).astype(dtype)  # wraps
        else:  # one rounding of the exact sum (float32 sums of 16-bit values are exact)
            want = _round(xt.astype(np.float64) + y.astype(np.float64), dtype)
            if dtype == "float32":
                want = (xt.astype(np.float32) + y.astype(np.float32)).astype(np.float64)
        np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=str((shape, d0, d1)))


def test_portable_blocks_match_the_simd_ones(rng):
    """Without SSE2/AVX2 the tiles take the compiler-unrolled 4x4 blocks: the same bytes."""
    portable = "#undef __AVX2__\n#undef __SSE2__\n" + _codegen.include(("cpu_common.h", "permute_cpu.h"))
    for dtype in ("int8", "float16", "float32", "int64"):
        for shape, perm in PERMUTE_PATHS[:5]:
            x = to_jittor(_values(shape, dtype, rng), dtype)
            flat = jt.ops.reshape(x, (x.numel(),))
            got = jt.code((x.numel(),), dtype, [flat], cpu_header=portable, cpu_src=PM._CPU_SRC["permute"],
                          data=PM.cpu_plan_data(shape, perm))
            want = ops.permute(x, *perm)
            assert got.numpy().tobytes() == want.numpy().tobytes(), (dtype, shape, perm)


# ---- expand_as / broadcast_to -----------------------------------------------------------------------------

from ops import broadcast as BC  # noqa: E402


def test_broadcast_cpu_data_drops_the_gpu_padding():
    cfg = BC.select_config((5, 1, 1), (5, 128, 128), "float32")  # padded to a bucket of groups on the GPU
    assert BC.cpu_forward_data(cfg) == {"n": 2, "A": 5, "a": 1, "B": 16384, "b": 0}
    assert BC.cpu_forward_data(BC.select_config((1,), (512, 512), "float32")) == {"n": 1, "A": 262144, "a": 0}


@pytest.mark.parametrize("dtype", ["bool", "int8", "float16", "bfloat16", "float32", "int64", "float64"])
def test_broadcast_fills_of_a_megabyte_and_more_are_exact(dtype, rng):
    """Runs of 1 MB and more are stored as strings of the element's bits (broadcast_cpu.h: fill_run), one word
    size per dtype: every element, the runs' boundaries and the last element hold x's bits, NaN payloads and
    signed zeros included; runs just under the threshold (the loop) too."""
    limit = 1 << 20
    itemsize = np.dtype("uint16" if dtype == "bfloat16" else dtype).itemsize
    run = limit // itemsize + 3
    for x_shape, out in [((1,), (run,)), ((3, 1), (3, run)), ((2, 1, 1), (2, 2, run - 4))]:
        a = random_array(x_shape, dtype, rng)
        if dtype in ("float16", "float32", "float64"):
            nan_bits = {"float16": 0x7E01, "float32": 0x7FC00123, "float64": 0x7FF8000000000ABC}[dtype]
            a.reshape(-1)[0] = np.array(nan_bits, f"uint{8 * itemsize}").view(dtype)
            a.reshape(-1)[-1] = -0.0
        got = ops.broadcast_to(to_jittor(a, dtype), out).numpy()
        want = np.broadcast_to(a, out)
        assert got.shape == want.shape
        bits = "uint16" if dtype == "bfloat16" else f"uint{8 * itemsize}" if dtype != "bool" else "uint8"
        np.testing.assert_array_equal(np.ascontiguousarray(got).view(bits), np.ascontiguousarray(want).view(bits),
                                      err_msg=str(out))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_broadcast_grad_sums_rows_of_every_length(dtype, rng):
    """Row sums over lengths around the 8 partial sums (1, 7, 8, 9, 1001), a split row and a split column, each
    within the float32 (float64) summation bound of the float64 sum, and the same bits twice."""
    for x_shape, out in [((9, 1), (9, 1)), ((6, 1), (6, 7)), ((6, 1), (6, 8)), ((5, 1), (5, 9)),
                         ((3, 1), (3, 1001)), ((1,), (300000,)), ((1, 33), (3000, 33))]:
        x = to_jittor(random_array(x_shape, dtype, rng), dtype)
        dy_np = random_array(out, dtype, rng)
        y = ops.broadcast_to(x, out)
        dx = jt.grad(InjectGrad.apply(y, to_jittor(dy_np, dtype)).sum(), x)
        again = jt.grad(InjectGrad.apply(ops.broadcast_to(x, out), to_jittor(dy_np, dtype)).sum(), x)
        assert dx.numpy().tobytes() == again.numpy().tobytes()
        axes = tuple(d for d in range(len(out)) if (len(x_shape) < len(out) and d < len(out) - len(x_shape))
                     or (x_shape[d - (len(out) - len(x_shape))] == 1 and out[d] != 1))
        want = np.asarray(dy_np, np.float64).sum(axis=axes).reshape(x_shape)
        terms = int(np.prod(out)) // int(np.prod(x_shape))
        u = 2.0 ** -53 if dtype == "float64" else 2.0 ** -24
        bound = terms * u * np.abs(np.asarray(dy_np, np.float64)).sum(axis=axes).reshape(x_shape)
        rounding = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}.get(dtype, 0.0) * np.abs(want)
        np.testing.assert_array_less(np.abs(to_numpy64(dx) - want), bound + rounding + 1e-300, err_msg=str(out))
