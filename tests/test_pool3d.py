"""max_pool3d: shape algebra, dispatch table, values and indices for every dtype (CPU; GPU under -m cuda),
NaN and empty windows, deterministic gradients of the three backward algorithms, errors, the case table, and an
nvcc compile of every kernel the dispatcher renders."""
import math
import os
import re

import numpy as np
import pytest

import ops
from ops import pool3d as P
from ops._jittor import jt
from ops.scoring import fam_pool3d as F
from ops.scoring.harness import InjectGrad, to_numpy64
from ops.scoring.harness import to_jittor as _to_jittor
from ops.scoring.spec import DEFAULT_TOLERANCE, random_array

DTYPES = ["float32", "float16", "bfloat16", "float64"]


def to_jittor(a, dtype):
    """The harness's conversion, except float64 (jt.array of a float64 array rounds it to float32)."""
    return jt.array(a, dtype="float64") if dtype == "float64" else _to_jittor(a, dtype)


def pool(x_np, dtype, **kw):
    """Our values (float64) and indices (int64) for a NumPy input."""
    y, idx = ops.max_pool3d(to_jittor(x_np, dtype), return_indices=True, **kw)
    return to_numpy64(y), idx.numpy().astype(np.int64)


def grad(x_np, dy_np, dtype, **kw):
    """dx of max_pool3d with the output gradient dy (only our backward kernels run)."""
    x = to_jittor(x_np, dtype)
    y = ops.max_pool3d(x, **kw)
    loss = InjectGrad.apply(y, to_jittor(dy_np, dtype)).sum()
    return jt.grad(loss, x)


def assert_grad_close(got, want, dtype, msg="", abs_sum=None, terms=1):
    """``abs_sum``: the sum of |dy| over the windows feeding each element, ``terms`` the most windows one
    element can get: a float32 (float64 for float64) sum of n terms is off by at most (n - 1) * u * sum |dy_i|
    (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4), on top of the output's rounding."""
    rtol, atol = DEFAULT_TOLERANCE[dtype]
    if abs_sum is not None and terms > 1:
        u = 2.0 ** -53 if dtype == "float64" else 2.0 ** -24
        atol = atol + (terms - 1) * u * abs_sum
    err = np.abs(np.asarray(got, np.float64) - want)
    bad = err > atol + rtol * np.abs(want)
    assert not bad.any(), f"{msg}: {bad.sum()} of {bad.size} gradient elements off, worst {err.max():.3g}"


# ---- shape algebra ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, k, s, p, d, ceil, want", [
    (8, 2, 2, 0, 1, False, 4), (7, 2, 2, 0, 1, False, 3), (7, 2, 2, 0, 1, True, 4),
    (5, 2, 2, 1, 1, True, 3),  # PyTorch drops the last window that would start in the right padding
    (5, 2, 2, 1, 1, False, 3), (6, 3, 2, 1, 1, True, 4), (6, 3, 2, 1, 1, False, 3),
    (32, 3, 1, 0, 2, False, 28), (8, 8, 8, 0, 1, False, 1), (8, 8, 1, 0, 1, False, 1), (2, 3, 1, 0, 1, False, 0),
    (2, 2, 1, 1, 3, False, 1), (1, 1, 1, 0, 1, True, 1), (10, 4, 3, 2, 1, True, 4),
])
def test_pool_output_size(n, k, s, p, d, ceil, want):
    assert P.pool_output_size(n, k, s, p, d, ceil) == want


def test_normalize_params():
    p = P.normalize_params(3)
    assert (p.kernel, p.stride, p.padding, p.dilation, p.ceil_mode) == ((3,) * 3, (3,) * 3, (0,) * 3, (1,) * 3, False)
    p = P.normalize_params((1, 2, 3), [1, 1, 2], (0, 1, 1), 2, True)
    assert (p.kernel, p.stride, p.padding, p.dilation, p.ceil_mode) == ((1, 2, 3), (1, 1, 2), (0, 1, 1), (2,) * 3, True)
    assert P.normalize_params(2, stride=()).stride == (2, 2, 2)
    assert P.normalize_params(np.int64(2)).kernel == (2, 2, 2)


def test_one_element_tuples_mean_the_same_in_every_dim():
    """PyTorch's max_pool3d takes kernel_size, stride, padding and dilation as an int or 1 or 3 ints."""
    p = P.normalize_params((3,), stride=(2,), padding=[1], dilation=(np.int32(2),), ceil_mode=True)
    assert (p.kernel, p.stride, p.padding, p.dilation) == ((3,) * 3, (2,) * 3, (1,) * 3, (2,) * 3)
    assert P.normalize_params(jt.array(2)).kernel == (2, 2, 2)  # a one-element integer Var, like a 0-d tensor
    for bad in ((2, 2), (), (2, 2, 2, 2)):
        with pytest.raises(ValueError, match="kernel_size must be an int or a tuple of 1 or 3 ints"):
            P.normalize_params(bad)
    with pytest.raises(TypeError, match="stride must be an int"):
        P.normalize_params(2, stride=(2.0,))
    with pytest.raises(TypeError, match="padding must be an int, got a jittor Var of dtype float32"):
        P.normalize_params(2, padding=jt.array(1.0))


def test_one_element_tuples_pool_as_ints(device, rng):
    x = random_array((2, 3, 9, 8, 7), "float32", rng)
    y, idx = ops.max_pool3d(to_jittor(x, "float32"), (3,), (2,), (1,), (1,), return_indices=True)
    want, want_idx = F.reference_pool(x, 3, 2, 1, 1)
    np.testing.assert_array_equal(to_numpy64(y), want)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    assert tuple(ops.MaxPool3d((2,))(to_jittor(x, "float32")).shape) == (2, 3, 4, 4, 3)


def test_window_predicates():
    p = P.normalize_params(2)
    assert P.padding_free((8, 8, 8), (4, 4, 4), p) and P.windows_disjoint(p)
    assert P.padding_free((8, 8, 9), (4, 4, 4), p)  # floor mode's remainder: no window reads past the end
    pc = P.normalize_params(2, ceil_mode=True)
    assert not P.padding_free((8, 8, 9), (4, 4, 5), pc)
    assert P.windows_disjoint(P.normalize_params(2, 3))  # gaps between windows
    assert not P.windows_disjoint(P.normalize_params(3, 2)) and P.windows_disjoint(P.normalize_params(3, 3))
    assert not P.windows_disjoint(P.normalize_params(2, 2, dilation=2))
    assert P.windows_disjoint(P.normalize_params(2, 3, dilation=2))


def _brute_force(x, k, s, p, d, ceil):
    """PyTorch's loop, written out: the reference the vectorized F.reference_pool must equal."""
    spatial = x.shape[-3:]
    out = [P.pool_output_size(n, *a, ceil) for n, a in zip(spatial, zip(k, s, p, d))]
    y = np.full(x.shape[:-3] + tuple(out), -np.inf)
    arg = np.full(y.shape, -1)
    for lead in np.ndindex(*x.shape[:-3]):
        for o in np.ndindex(*out):
            best, pos = None, -1
            for w in np.ndindex(*k):
                c = [o[a] * s[a] - p[a] + w[a] * d[a] for a in range(3)]
                if not all(0 <= c[a] < spatial[a] for a in range(3)):
                    continue
                v = x[lead + tuple(c)]
                if pos < 0 or np.isnan(v) or (not np.isnan(best) and v > best):
                    best, pos = v, (c[0] * spatial[1] + c[1]) * spatial[2] + c[2]
            if pos >= 0:
                y[lead + o], arg[lead + o] = best, pos
    return y, arg


@pytest.mark.parametrize("k, s, p, d, ceil", [
    ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1), True),
    ((3, 2, 3), (2, 1, 2), (1, 1, 1), (1, 2, 1), True),
    ((3, 3, 3), (1, 1, 1), (1, 0, 1), (1, 1, 2), False),
])
def test_reference_is_pytorchs_loop(k, s, p, d, ceil, rng):
    x = rng.integers(0, 4, size=(2, 5, 6, 7)).astype(np.float64)
    special = rng.choice(x.size, 25, replace=False)
    x.reshape(-1)[special[:5]] = np.nan
    x.reshape(-1)[special[5:]] = -np.inf  # windows whose elements inside are all -inf: the first one inside
    want, want_arg = _brute_force(x, k, s, p, d, ceil)
    got, got_arg = F.reference_pool(x, k, s, p, d, ceil)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_arg, want_arg)
    x.reshape(-1)[rng.random(x.size) < 0.9] = -np.inf  # most windows: -inf inside only, some a NaN too
    want, want_arg = _brute_force(x, k, s, p, d, ceil)
    assert (want == -np.inf).any()
    got, got_arg = F.reference_pool(x, k, s, p, d, ceil)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_arg, want_arg)


def _beats(bv, bp, av, ap):
    """pool3d_beats of pool3d.cuh, line for line."""
    if bp < 0:
        return False
    if ap < 0:
        return True
    an, bn = math.isnan(av), math.isnan(bv)
    if an or bn:
        return bn and (not an or bp > ap)
    if bv != av:
        return bv > av
    return bp < ap


def _scan(vals, positions):
    """Pool3dBest::offer<true> over ``positions`` in order (None = padding)."""
    v, p = 0.0, -1
    for e in positions:
        c = vals[e]
        if c is None:
            continue
        if p < 0 or math.isnan(c) or (not math.isnan(v) and c > v):
            v, p = c, e
    return v, p


def test_warp_merge_reproduces_the_in_order_scan(rng):
    """Emulates pool3d_window_max_warp: lane l scans elements l, l + 32, ..., then a 5-step xor butterfly."""
    for trial in range(300):
        n = int(rng.integers(32, 200))
        vals = [float(v) for v in rng.integers(0, 3, size=n)]
        for e in rng.choice(n, int(rng.integers(0, 4)), replace=False):
            vals[e] = math.nan
        for e in rng.choice(n, int(rng.integers(0, n // 2)), replace=False):
            vals[e] = None
        lanes = [_scan(vals, range(lane, n, 32)) for lane in range(32)]
        m = 16
        while m:
            lanes = [lanes[i ^ m] if _beats(*lanes[i ^ m], *lanes[i]) else lanes[i] for i in range(32)]
            m //= 2
        want = _scan(vals, range(n))
        assert all(lane[1] == want[1] for lane in lanes), (trial, lanes[0], want)


def _kw(k, s=None, p=0, d=1, ceil=False):
    return dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)


@pytest.mark.parametrize("spatial, kw", [((7, 9, 11), _kw(3, 2, ceil=True)), ((31, 9, 7), _kw(2, ceil=True)),
                                         ((5, 8, 9), _kw((1, 3, 2), (1, 2, 2), ceil=True)), ((4, 4, 4), _kw(2))])
def test_clamped_scan_matches_the_checked_scan(spatial, kw, rng):
    """fwd_flat's clamp (pool3d_window_max<..., CLAMP>): indices past the end read the dim's last element;
    the scan (Pool3dBest::offer, seeded with the window's first element) gives the reference's value and
    index on data full of ties and NaNs."""
    params = P.normalize_params(**kw)
    assert P.clamp_exact(params)
    x = rng.integers(0, 3, size=spatial).astype(np.float64)
    x.reshape(-1)[rng.choice(x.size, x.size // 8, replace=False)] = np.nan
    want, want_idx = F.reference_pool(x[None, None], **kw)
    flat = [float(v) for v in x.reshape(-1)]
    D, H, W = spatial
    for od, oh, ow in np.ndindex(*want.shape[2:]):
        order = []
        for i in range(params.kernel[0]):
            d = min(od * params.stride[0] + i, D - 1)
            for j in range(params.kernel[1]):
                h = min(oh * params.stride[1] + j, H - 1)
                for k in range(params.kernel[2]):
                    order.append((d * H + h) * W + min(ow * params.stride[2] + k, W - 1))
        _, p = _scan(flat, order)
        assert p == want_idx[0, 0, od, oh, ow], (od, oh, ow)


def _max_nan(a, b):
    """pool3d_max_nan of pool3d.cuh: NaN if either is NaN, else the larger."""
    return b if (math.isnan(b) or b > a) else a


def _taps(start, kernel, dilation, n, nopad):
    """The indices a window from ``start`` reads along one dim that lie inside [0, n): the kernels skip the
    others, or (``nopad``, a geometry without padding) have none to skip."""
    for i in range(kernel):
        at = start + i * dilation
        if nopad:
            assert 0 <= at < n
        elif not 0 <= at < n:
            continue
        yield at


def _emulate_rows(x, cfg, params):
    """pool3d_fwd_rows, line for line, on a (P, D, H, W) float64 array (asserts every chunk it loads is aligned
    and inside its row)."""
    P_, D, H, W = x.shape
    Do, Ho, Wo = P.output_shape((D, H, W), params)
    vec, kw, sw, pw = cfg.vec, cfg.k[2], cfg.sw, params.padding[2]
    (kd, kh, _), (sd, sh, _), (dd, dh, _), (pd, ph, _) = params.kernel, params.stride, params.dilation, params.padding
    assert pw <= vec
    span = sw * (vec - 1) + kw
    lead = vec if pw > 0 else 0
    nch = -(-(span + lead) // vec)
    flat = x.reshape(-1)
    y = np.full((P_, Do, Ho, Wo), np.nan)
    groups = -(-Wo // vec)
    for item in range(P_ * Do * Ho * groups):
        q0, og = divmod(item, groups)
        q1, oh = divmod(q0, Ho)
        plane, od = divmod(q1, Do)
        w0 = og * vec * sw
        c0 = w0 - lead
        col = [-math.inf] * (nch * vec)
        for d in _taps(od * sd - pd, kd, dd, D, cfg.nopad):
            for h in _taps(oh * sh - ph, kh, dh, H, cfg.nopad):
                row = plane * D * H * W + (d * H + h) * W
                for c in range(nch):
                    cw = c0 + c * vec
                    if 0 <= cw < W:
                        start = row + cw
                        first = start - plane * D * H * W
                        assert start % vec == 0 and first // W == (first + vec - 1) // W  # one row
                        for e in range(vec):
                            col[c * vec + e] = _max_nan(col[c * vec + e], flat[start + e])
        for t in range(vec):
            ow = og * vec + t
            if ow < Wo:
                m = col[t * sw - pw + lead]
                for k in range(1, kw):
                    m = _max_nan(m, col[t * sw + k - pw + lead])
                if m == 0:  # pool3d_first_zero: the sign of the first zero in (d, h, w) order
                    m = _first_zero(x[plane], (od * sd - pd, oh * sh - ph, w0 + t * sw - pw), (kd, kh, kw),
                                    (dd, dh), cfg.nopad)
                y[plane, od, oh, ow] = m
    return y


def _first_zero(plane, start, kernel, dilation, nopad):
    """pool3d_first_zero of pool3d.cuh on one (D, H, W) plane."""
    D, H, W = plane.shape
    for d in _taps(start[0], kernel[0], dilation[0], D, nopad):
        for h in _taps(start[1], kernel[1], dilation[1], H, nopad):
            for k in range(kernel[2]):
                w = start[2] + k
                if 0 <= w < W and plane[d, h, w] == 0:
                    return plane[d, h, w]
    return 0.0


def _signed_zeros(shape, rng):
    """-1, -0.0 and 0.0 at random: windows whose maximum is a zero of either sign, first in any order."""
    return rng.choice(np.array([-1.0, -0.0, 0.0]), size=shape)


def _same_bits(got, want):
    same_signs = np.array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]))
    return np.array_equal(np.isnan(got), np.isnan(want)) and same_signs and np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("shape, dtype, kw", [
    ((2, 7, 6, 16), "float32", _kw(3, 1)),
    ((2, 9, 10, 20), "float32", _kw(5, 2)),
    ((1, 9, 9, 12), "float32", _kw(8, 1)),
    ((2, 9, 7, 16), "float16", _kw((2, 3, 3), (2, 1, 1))),
    ((2, 8, 9, 16), "float16", _kw((3, 2, 8), (1, 2, 2), d=(2, 3, 1))),
    ((3, 5, 6, 10), "float64", _kw((1, 2, 2), (2, 1, 1))),
    ((2, 4, 4, 12), "float32", _kw((2, 2, 4), (1, 1, 2))),
    # padded and ceil_mode windows (rows outside the input skipped, W padding in the chunk before w0)
    ((2, 9, 10, 16), "float32", _kw(3, 2, 1)),
    ((2, 9, 10, 16), "float16", _kw(3, 2, 1)),
    ((2, 7, 9, 12), "float32", _kw((3, 3, 4), (2, 2, 2), (1, 1, 1))),
    ((2, 7, 9, 12), "float64", _kw((2, 3, 4), (1, 2, 1), (1, 1, 1), (2, 1, 1))),
    ((2, 7, 9, 16), "bfloat16", _kw(3, 2, ceil=True)),
    ((2, 7, 9, 16), "float32", _kw((3, 3, 5), (2, 2, 2), (1, 0, 1), ceil=True)),
])
def test_rows_kernel_math_matches_the_reference(shape, dtype, kw, rng):
    """The fwd_rows index math (emulated) gives the reference values, NaN included, reading only in-row chunks."""
    params = P.normalize_params(**kw)
    cfg = P.select_config((1 << 16,) + shape, dtype, params, "fwd", on_cuda=True)  # many planes: not fwd_warp
    assert cfg.variant == "fwd_rows"
    x = rng.standard_normal(shape)
    x.reshape(-1)[rng.choice(x.size, 3, replace=False)] = np.nan
    want = F.reference_pool(x, **kw)[0]
    np.testing.assert_array_equal(_emulate_rows(x, cfg, params), want)
    zeros = _signed_zeros(shape, rng)  # the separable order is not (d, h, w) order: the rescan keeps the sign
    assert _same_bits(_emulate_rows(zeros, cfg, params), F.reference_pool(zeros, **kw)[0])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_values_on_gpu(dtype, rng):
    """fwd_rows (values only, no grad) on the GPU, with NaNs, and with zeros of both signs (the sign of the first
    maximum in (d, h, w) order), against the reference."""
    cases = [((2, 3, 12, 10, 16), _kw(3, 1)), ((2, 3, 9, 8, 12), _kw((2, 3, 2), (2, 1, 1))),
             ((64, 32, 8, 9, 16), _kw((3, 2, 8), (1, 2, 2), d=(2, 3, 1))), ((2, 16, 32, 32, 32), _kw(8, 1)),
             ((4, 32, 32, 32, 32), _kw(5, 2)), ((4, 32, 16, 16, 24), _kw(3, 1)),
             ((8, 16, 16, 28, 32), _kw(3, 2, 1)), ((2, 8, 7, 9, 16), _kw(3, 2, ceil=True)),
             ((4, 8, 8, 16, 32), _kw((1, 3, 3), (1, 2, 2), (0, 1, 1)))]
    previous = jt.flags.use_cuda
    jt.flags.use_cuda = 1
    try:
        xs = []
        for shape, kw in cases:
            assert P.select_config(shape, dtype, P.normalize_params(**kw), "fwd").variant == "fwd_rows"
            x = random_array(shape, dtype, rng)
            x.reshape(-1)[rng.choice(x.size, 3, replace=False)] = np.nan
            xs.append(x)
        zero_xs = [_signed_zeros(shape, rng) for shape, _ in cases]
        with jt.no_grad():
            outs = [ops.max_pool3d(to_jittor(x, dtype), **kw) for x, (_, kw) in zip(xs + zero_xs, cases + cases)]
        jt.sync(outs)
        for x, (shape, kw), y in zip(xs, cases, outs):
            np.testing.assert_array_equal(to_numpy64(y), F.reference_pool(x, **kw)[0], err_msg=str((shape, kw)))
        for x, (shape, kw), y in zip(zero_xs, cases, outs[len(cases):]):
            assert _same_bits(to_numpy64(y), F.reference_pool(x, **kw)[0]), (shape, kw)
    finally:
        jt.flags.use_cuda = previous


# ---- dispatch table ---------------------------------------------------------------------------------------

def _select(shape, dtype, kw, direction, cuda):
    """select_config; direction "fwd_idx" is a forward that also writes the indices (no fwd_rows)."""
    params = P.normalize_params(**kw)
    return P.select_config(shape, dtype, params, direction.split("_")[0], on_cuda=cuda,
                           indices=direction == "fwd_idx")


# (x shape, dtype, params, direction, on_cuda, expected variant, expected fields)
SELECT_TABLE = [
    ((8, 32, 32, 64, 64), "float32", _kw(2), "fwd", True, "fwd_k2s2_vec", dict(vec=4, opt=1, nopad=True)),
    ((16, 64, 16, 56, 56), "float16", _kw(2), "fwd", True, "fwd_k2s2_vec", dict(vec=8, opt=1)),
    ((4, 32, 32, 64, 64), "float64", _kw(2), "fwd", True, "fwd_k2s2_vec", dict(vec=2, opt=1)),
    ((8, 32, 32, 62, 62), "float32", _kw(2), "fwd", True, "fwd_k2s2_vec", dict(vec=2, opt=2)),
    ((1, 1, 4, 4, 4), "float32", _kw(2), "fwd", True, "fwd_k2s2_vec", dict(vec=4)),
    ((8, 32, 32, 63, 63), "float32", _kw(2), "fwd", True, "fwd_flat", dict(k=(2, 2, 2), nopad=True, opt=1)),
    ((8, 32, 31, 63, 63), "float32", _kw(2, ceil=True), "fwd", True, "fwd_flat",
     dict(k=(2, 2, 2), nopad=False, clamp=True)),  # ceil_mode's partial windows: clamped, not checked
    ((4, 32, 32, 32, 32), "float32", _kw(3, 1), "fwd_idx", True, "fwd_flat", dict(k=(3, 3, 3), nopad=True, opt=1)),
    ((4, 32, 32, 32, 32), "float32", _kw(3, 1), "fwd", True, "fwd_rows", dict(k=(0, 0, 3), vec=4, sw=1)),
    ((4, 32, 32, 32, 32), "float16", _kw(3, 1), "fwd", True, "fwd_rows", dict(k=(0, 0, 3), vec=8, sw=1)),
    ((4, 32, 32, 32, 32), "float64", _kw(3, 1), "fwd", True, "fwd_rows", dict(vec=2)),
    ((4, 32, 32, 32, 32), "bfloat16", _kw(3, 1), "fwd", True, "fwd_rows", dict(vec=8)),
    ((4, 32, 32, 48, 48), "float32", _kw((2, 3, 3), (2, 1, 1)), "fwd", True, "fwd_rows", dict(k=(0, 0, 3))),
    ((4, 32, 32, 32, 32), "float32", _kw(3, 1, d=2), "fwd", True, "fwd_flat", dict(k=(3, 3, 3))),  # W dilation
    ((4, 32, 32, 32, 31), "float32", _kw(3, 1), "fwd", True, "fwd_flat", dict(k=(3, 3, 3))),  # W % 2 != 0
    ((4, 32, 32, 64, 64), "float32", _kw(4), "fwd", True, "fwd_flat", dict(k=(0, 0, 0))),  # W stride 4
    # padded: fwd_rows (values only) while the W padding fits the chunk before the first window
    ((8, 64, 16, 56, 56), "float32", _kw(3, 2, 1), "fwd", True, "fwd_rows", dict(k=(0, 0, 3), vec=4, nopad=False)),
    ((8, 64, 16, 56, 56), "float32", _kw(3, 2, 1), "fwd_idx", True, "fwd_flat",
     dict(k=(3, 3, 3), nopad=False, clamp=False)),  # padding: checked
    ((8, 32, 31, 64, 64), "bfloat16", _kw(2, ceil=True), "fwd", True, "fwd_rows", dict(vec=8, sw=2, nopad=False)),
    ((4, 32, 16, 16, 16), "float64", _kw((1, 1, 7), (1, 1, 2), (0, 0, 3)), "fwd", True, "fwd_flat",
     dict(nopad=False)),  # W padding 3 > vec 2
    ((2, 16, 32, 32, 32), "float32", _kw(8, 1), "fwd_idx", True, "fwd_flat", dict(k=(8, 8, 8), opt=1)),
    ((2, 16, 32, 32, 32), "float32", _kw(8, 1), "fwd", True, "fwd_rows", dict(k=(0, 0, 8), vec=4)),
    ((4, 32, 32, 32, 32), "float32", _kw(5, 2), "fwd_idx", True, "fwd_flat", dict(k=(0, 0, 0), nopad=True)),
    ((4, 32, 32, 32, 32), "float32", _kw(5, 2), "fwd", True, "fwd_rows", dict(k=(0, 0, 5), sw=2, vec=4)),
    ((64, 64, 64, 128, 128), "float32", _kw(3, 1), "fwd", True, "fwd_rows", dict(index_type="long long")),
    ((8, 32, 16, 64, 64), "float32", _kw((1, 3, 3), (1, 2, 2), (0, 1, 1)), "fwd", True, "fwd_rows",
     dict(k=(0, 0, 3), nopad=False)),
    ((8, 32, 16, 64, 64), "float32", _kw((1, 3, 3), (1, 2, 2), (0, 1, 1)), "fwd_idx", True, "fwd_flat",
     dict(k=(1, 3, 3), nopad=False)),
    ((64, 64, 8, 8, 8), "float32", _kw(8), "fwd", True, "fwd_warp", dict(k=(8, 8, 8), nopad=True)),
    ((2, 64, 32, 32, 32), "float32", _kw(8), "fwd", True, "fwd_warp", dict(k=(8, 8, 8))),  # 8192 outputs
    ((8, 64, 32, 32, 32), "float32", _kw(8), "fwd", True, "fwd_flat", dict(k=(8, 8, 8))),  # 32768: flat
    ((16, 32, 32, 8, 8), "float32", _kw((2, 8, 8)), "fwd", True, "fwd_warp", dict(k=(2, 8, 8))),
    ((64, 32, 64, 4, 4), "float32", _kw((3, 4, 4), (1, 4, 4)), "fwd", True, "fwd_warp", dict(k=(0, 0, 0))),
    ((1, 2, 12, 12, 12), "float32", _kw(5, 1, 2), "fwd", True, "fwd_warp", dict(k=(0, 0, 0), nopad=False)),
    ((2, 3, 8, 8, 8), "float32", _kw(2), "fwd", False, "fwd_cpu", dict(nopad=True, block=0)),
    ((64, 64, 64, 128, 128), "float32", _kw(2), "fwd", True, "fwd_k2s2_vec", dict(index_type="long long")),
    # gather: runs of 16 bytes along W (4 floats, 8 halves, 2 doubles), one per thread, or 32 bytes of 4- and
    # 8-byte elements where an element lies in at most 8 windows; 3 windows along W gather, 5 or more take bwd_runs
    ((4, 32, 32, 32, 32), "float32", _kw(3, 1), "bwd", True, "bwd_gather",
     dict(vec=4, window=((3, 3, 3), (1, 1, 1), (1, 1, 1)))),
    ((2, 4, 40, 40, 32), "float32", _kw((5, 5, 3), 1, 0, (3, 3, 1)), "bwd", True, "bwd_gather",
     dict(vec=4, window=None)),
    ((4, 32, 32, 32, 32), "float32", _kw(5, 1), "bwd", True, "bwd_runs", dict(vec=4)),
    ((4, 32, 32, 32, 32), "float32", _kw((3, 3, 5), 1, 0, (1, 1, 2)), "bwd", True, "bwd_runs", dict(vec=4)),
    ((4, 32, 32, 32, 32), "float32", _kw((3, 3, 9), (1, 1, 2)), "bwd", True, "bwd_runs", dict(vec=4)),
    ((4, 32, 32, 32, 32), "float32", _kw((3, 3, 7), (1, 1, 2)), "bwd", True, "bwd_gather", dict(vec=4)),
    ((4, 32, 32, 32, 32), "float32", _kw(3, 3, 0, 2), "bwd", True, "bwd_gather", dict(vec=8)),  # 1 along W
    ((4, 32, 32, 32, 32), "float32", _kw(5, 1, 0, (2, 2, 1)), "bwd", True, "bwd_runs", dict(vec=4)),
    # 8 windows along W, but kd * kh = 256: a run's head would not fit bwd_runs' byte
    ((1, 1, 20, 20, 20), "float32", _kw((16, 16, 8), 1), "bwd", True, "bwd_gather", dict(vec=4)),
    ((1, 1, 20, 20, 20), "float32", _kw((15, 16, 8), 1), "bwd", True, "bwd_runs", dict(vec=4)),
    ((8, 64, 16, 56, 56), "float32", _kw(3, 2, 1), "bwd", True, "bwd_gather",
     dict(vec=8, window=((3, 3, 3), (2, 2, 2), (1, 1, 1)))),
    ((8, 64, 16, 56, 56), "float64", _kw(3, 2, 1), "bwd", True, "bwd_gather", dict(vec=4)),
    ((8, 64, 16, 56, 56), "bfloat16", _kw(3, 2, 1), "bwd", True, "bwd_gather", dict(vec=8)),
    ((2, 16, 32, 32, 32), "float32", _kw(8, 1), "bwd", True, "bwd_runs", dict(vec=4)),
    ((2, 16, 32, 32, 30), "float16", _kw(8, 1), "bwd", True, "bwd_runs", dict(vec=8)),
    ((2, 3, 5, 6, 9), "float64", _kw(5, 1), "bwd", True, "bwd_runs", dict(vec=2)),
    ((64, 64, 64, 128, 128), "float32", _kw(5, 1), "bwd", True, "bwd_runs", dict(index_type="long long")),
    ((64, 64, 64, 128, 128), "float32", _kw(3, 1), "bwd", True, "bwd_gather", dict(index_type="long long")),
    ((64, 64, 64, 128, 128), "float32", _kw(3, 2, 1), "bwd", True, "bwd_gather", dict(index_type="long long")),
    # disjoint windows gather too
    ((8, 32, 32, 64, 64), "float32", _kw(2), "bwd", True, "bwd_gather",
     dict(vec=8, window=((2, 2, 2), (2, 2, 2), (1, 1, 1)))),
    ((4, 32, 32, 64, 64), "float32", _kw(4), "bwd", True, "bwd_gather",
     dict(vec=8, window=((4, 4, 4), (4, 4, 4), (1, 1, 1)))),
    ((4, 32, 32, 32, 32), "float32", _kw(3, 1, d=2), "bwd", True, "bwd_gather",
     dict(vec=8, window=((3, 3, 3), (1, 1, 1), (2, 2, 2)))),  # GATHER_WIDE_WINDOWS
    ((4, 32, 32, 32, 31), "float32", _kw(3, 1, d=2), "bwd", True, "bwd_gather",
     dict(vec=4, window=((3, 3, 3), (1, 1, 1), (2, 2, 2)))),
    # k4s2: the runtime window, 32-byte runs (8 windows an element)
    ((4, 32, 32, 64, 64), "float32", _kw(4, 2), "bwd", True, "bwd_gather", dict(vec=8, window=None)),
    ((8, 32, 32, 63, 63), "float32", _kw(2, 3), "bwd", True, "bwd_disjoint", dict(vec=8)),  # 30% of x in a window
    # the tests' case
    ((2, 3, 10, 11, 13), "float16", _kw(2, 3, 1, ceil=True), "bwd", True, "bwd_disjoint", dict(vec=16)),
    ((16, 32, 33, 8, 8), "float32", _kw((2, 8, 8), (3, 8, 8)), "bwd", True, "bwd_gather", {}),  # 67%: gathers
    ((8, 32, 31, 63, 63), "float32", _kw(2, ceil=True), "bwd", True, "bwd_gather",
     dict(vec=4, window=((2, 2, 2), (2, 2, 2), (1, 1, 1)))),
    ((2, 3, 8, 8, 9), "float32", _kw(2), "bwd", False, "bwd_gather_cpu", dict(vec=1)),
    ((2, 3, 8, 8, 8), "float32", _kw(3, 1), "bwd", False, "bwd_gather_cpu", dict(vec=1)),
    ((2, 3, 8, 8, 8), "bfloat16", _kw(3, 1), "bwd", False, "bwd_gather_cpu", dict(vec=1)),
]


@pytest.mark.parametrize("shape, dtype, kw, direction, cuda, variant, fields", SELECT_TABLE)
def test_select_config(shape, dtype, kw, direction, cuda, variant, fields):
    cfg = _select(shape, dtype, kw, direction, cuda)
    assert cfg.variant == variant
    for name, value in fields.items():
        assert getattr(cfg, name) == value, name
    if cuda:
        assert cfg.block == P.BLOCK
        assert P.menu_index(cfg, dtype, P.MODE_BOTH if direction == "fwd_idx" else P.MODE_VALUES) >= 0
    if "index_type" not in fields:
        assert cfg.index_type == "int"


def test_every_variant_and_flag_is_selected():
    cfgs = [_select(s, d, kw, direction, c) for s, d, kw, direction, c, _, _ in SELECT_TABLE]
    assert {c.variant for c in cfgs} == set(P.VARIANTS["fwd"]) | set(P.VARIANTS["bwd"])
    cuda = [c for c in cfgs if c.block]
    assert {c.nopad for c in cuda} == {True, False}
    assert {c.clamp for c in cuda if c.variant == "fwd_flat"} == {True, False}
    assert {c.index_type for c in cuda} == {"int", "long long"}
    assert any(all(c.k) for c in cuda) and any(not any(c.k) for c in cuda)  # unrolled and generic windows
    assert {c.vec for c in cuda if c.vec > 1} == {2, 4, 8, 16}  # 16: bwd_disjoint of 2-byte elements


def test_menus_hold_every_configuration_and_the_sources_name_no_size():
    """Every CUDA configuration is in its translation unit's menu; the source names no size and no pooling
    parameter, so layers of any size and window share one compile per dtype, index type and direction."""
    for s, d, kw, direction, c, _, _ in SELECT_TABLE:
        if not c:
            continue
        cfg = _select(s, d, kw, direction, c)
        mode = P.MODE_BOTH if direction == "fwd_idx" else P.MODE_VALUES
        menu = P.menus(ops._codegen.ITEMSIZE[d])
        name = {"fwd": "values" if mode == P.MODE_VALUES else "both", "bwd": "gather"}[direction[:3]]
        assert menu[name].entries[P.menu_index(cfg, d, mode)] == P._entry(cfg)
    src = P.cuda_forward_src("int", P.MODE_VALUES)
    # the only number: the null index pointer (no size, no parameter)
    assert "data[\"v\"]" in src and re.findall(r"\b\d+\b", src) == ["0"]
    assert "data[\"bv\"]" in P.cuda_backward_src("int")
    assert "long long>" in P.cuda_forward_src("long long", P.MODE_BOTH)


def test_plans_are_made_once_per_signature(rng):
    """A repeated call with the same signature plans nothing; a new shape, dtype, parameter or grad mode does;
    reload_switches forgets every plan."""
    cache = P._PLANS
    x = to_jittor(random_array((2, 3, 8, 10, 12), "float32", rng), "float32")
    ops.max_pool3d(x, 2).sync()
    built = cache.builds
    for _ in range(3):
        ops.max_pool3d(x, 2).sync()
    assert cache.builds == built
    ops.max_pool3d(x, [2, 2, 2]).sync()  # a list argument: planned once under its tuple form
    ops.max_pool3d(x, [2, 2, 2]).sync()
    assert cache.builds == built + 1
    ops.max_pool3d(x, 3).sync()
    ops.max_pool3d(to_jittor(random_array((2, 3, 8, 10, 14), "float32", rng), "float32"), 2).sync()
    ops.max_pool3d(to_jittor(random_array((2, 3, 8, 10, 12), "float16", rng), "float16"), 2).sync()
    with jt.no_grad():
        ops.max_pool3d(x, 2).sync()
    assert cache.builds == built + 5
    ops._launch.reload_switches()
    assert len(cache) == 0
    ops.max_pool3d(x, 2).sync()
    assert cache.builds == built + 6
    with pytest.raises(ValueError, match="kernel_size"):  # a bad call stores no plan: it raises every time
        ops.max_pool3d(x, 0)
    with pytest.raises(ValueError, match="kernel_size"):
        ops.max_pool3d(x, 0)


def test_plan_cache_is_bounded_and_drops_its_oldest_plan_first():
    cache = ops._launch.PlanCache("bounded-test", maxsize=3)
    for k in range(5):
        cache.put(("k", k), k)
    assert len(cache) == 3 and cache.get(("k", 0)) is None and cache.get(("k", 4)) == 4
    cache.put(("k", 5), 5)
    assert cache.get(("k", 2)) is None and cache.get(("k", 3)) == 3
    assert cache.miss(("k", 2), lambda: "again") == "again" and cache.get(("k", 3)) is None  # planned anew
    assert cache.miss(["k", 5], lambda: "unused") == 5  # a list key finds its tuple form's plan


# ---- values and indices -----------------------------------------------------------------------------------

VALUE_CASES = [
    ((2, 3, 8, 10, 12), _kw(2)),
    ((2, 3, 7, 9, 11), _kw(2)),
    ((3, 9, 8, 7), _kw(3, 1)),  # 4-D input (C, D, H, W)
    ((2, 2, 9, 12, 11), _kw(3, 2, 1)),
    ((1, 2, 12, 12, 12), _kw(8, 1)),
    ((3, 2, 8, 8, 8), _kw(8)),  # D == H == W == kernel: output 1x1x1
    ((2, 2, 6, 8, 8), _kw((2, 8, 8))),  # h = w = 1
    ((2, 3, 10, 11, 12), _kw((1, 3, 2), (1, 2, 3), (0, 1, 1), (1, 2, 1))),
    ((2, 3, 7, 9, 11), _kw(3, 2, ceil=True)),
    ((2, 2, 6, 7, 9), _kw(3, 2, 1, ceil=True)),
    ((1, 1, 4, 4, 4), _kw(2)),
    ((1, 1, 1, 1, 1), _kw(1)),
    ((2, 1, 5, 1, 6), _kw((5, 1, 2), (1, 1, 2))),
    ((1, 2, 13, 9, 10), _kw(5, 2, 2, 2)),
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_and_indices(device, dtype, rng):
    xs = [random_array(shape, dtype, rng) for shape, _ in VALUE_CASES]
    outs = [ops.max_pool3d(to_jittor(x, dtype), return_indices=True, **kw) for x, (_, kw) in zip(xs, VALUE_CASES)]
    jt.sync([v for pair in outs for v in pair])  # new kernels compile in parallel
    for x, (shape, kw), (y, idx) in zip(xs, VALUE_CASES, outs):
        want, want_idx = F.reference_pool(x, **kw)
        got = to_numpy64(y)
        assert got.shape == want.shape, (shape, kw)
        np.testing.assert_array_equal(got, want, err_msg=str((shape, kw)))  # a maximum is an input element
        np.testing.assert_array_equal(idx.numpy(), want_idx, err_msg=str((shape, kw)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_without_indices(device, dtype, rng):
    cases = VALUE_CASES[:3] + VALUE_CASES[5:7]
    xs = [random_array(shape, dtype, rng) for shape, _ in cases]
    with jt.no_grad():  # no backward can follow: the overlapping (3, 1) case skips its indices too
        outs = [ops.max_pool3d(to_jittor(x, dtype), **kw) for x, (_, kw) in zip(xs, cases)]
    jt.sync(outs)
    for x, (shape, kw), y in zip(xs, cases, outs):
        np.testing.assert_array_equal(to_numpy64(y), F.reference_pool(x, **kw)[0], err_msg=str((shape, kw)))


def test_ties_keep_the_first_maximum(device, rng):
    x = rng.integers(0, 3, size=(2, 3, 8, 9, 10)).astype(np.float32)  # many equal values
    for kw in (_kw(2), _kw(3, 1), _kw(3, 2, 1), _kw(8, 1), _kw(3, 2, ceil=True)):
        got, idx = pool(x, "float32", **kw)
        want, want_idx = F.reference_pool(x, **kw)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(idx, want_idx)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nan_propagates(device, dtype, rng):
    x = random_array((2, 2, 8, 8, 8), dtype, rng)
    x.reshape(-1)[rng.choice(x.size, 12, replace=False)] = np.nan
    x[0, 0, 0, 0, 0] = x[0, 0, 1, 1, 1] = np.nan  # two NaNs in one k2s2 window: the index is the last
    for kw in (_kw(2), _kw(3, 1), _kw(3, 2, 1), _kw(8), _kw(3, 2, ceil=True)):
        got, idx = pool(x, dtype, **kw)
        want, want_idx = F.reference_pool(x, **kw)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.nan_to_num(got), np.nan_to_num(want))
        np.testing.assert_array_equal(idx, want_idx)
    assert pool(x, dtype, **_kw(2))[1][0, 0, 0, 0, 0] == 64 + 8 + 1


def test_infinities_and_windows_without_elements(device):
    x = np.array([-np.inf, 1.0, -np.inf, np.inf], np.float32).reshape(1, 1, 1, 1, 4)
    got, idx = pool(x, "float32", **_kw((1, 1, 2)))
    assert got.tolist() == [[[[[1.0, np.inf]]]]] and idx.tolist() == [[[[[1, 3]]]]]
    x = np.full((1, 1, 1, 1, 2), -np.inf, np.float32)
    got, idx = pool(x, "float32", **_kw((1, 1, 2)))
    assert got.tolist() == [[[[[-np.inf]]]]] and idx.tolist() == [[[[[0]]]]]  # the first -inf
    # W = 2, kernel 2, dilation 3, padding 1: the window reads w = -1 and w = 2, both padding
    x = np.ones((1, 1, 1, 1, 2), np.float32)
    got, idx = pool(x, "float32", **_kw((1, 1, 2), 1, (0, 0, 1), (1, 1, 3)))
    want, want_idx = F.reference_pool(x, **_kw((1, 1, 2), 1, (0, 0, 1), (1, 1, 3)))
    assert got.tolist() == want.tolist() == [[[[[-np.inf]]]]] and idx.tolist() == want_idx.tolist() == [[[[[-1]]]]]


def test_empty_batch_and_module(device, rng):
    y, idx = ops.max_pool3d(jt.zeros((0, 3, 4, 4, 4)), 2, return_indices=True)
    assert list(y.shape) == [0, 3, 2, 2, 2] and list(idx.shape) == [0, 3, 2, 2, 2]
    x = random_array((2, 3, 6, 6, 6), "float32", rng)
    m = ops.MaxPool3d(3, stride=2, padding=1)
    np.testing.assert_array_equal(m(jt.array(x)).numpy(), F.reference_pool(x, 3, 2, 1)[0])
    y, idx = ops.MaxPool3d(2, return_indices=True)(jt.array(x))
    np.testing.assert_array_equal(idx.numpy(), F.reference_pool(x, 2)[1])
    with jt.no_grad():
        np.testing.assert_array_equal(ops.max_pool3d(jt.array(x), 3, 1).numpy(), F.reference_pool(x, 3, 1)[0])


# ---- gradients --------------------------------------------------------------------------------------------

GRAD_CASES = [
    ((2, 3, 8, 10, 12), _kw(2)),  # tile (k2s2)
    ((2, 3, 9, 9, 6), _kw(3)),  # tile (k3)
    ((2, 2, 8, 8, 8), _kw(8)),  # tile, one window per plane
    ((2, 3, 7, 9, 11), _kw(2, ceil=True)),  # tile with partial last windows (bounds-checked)
    ((2, 3, 7, 8, 11), _kw(3, ceil=True)),  # the same with k3: last windows of 1 and 2 elements
    ((2, 3, 7, 9, 11), _kw(2)),  # tile: floor mode's remainder, zeroed by the last windows
    ((2, 3, 7, 8, 11), _kw(3)),  # the same with k3: remainders of 1 and 2 elements
    ((2, 3, 8, 9, 11), _kw(2, 3)),  # disjoint: gaps between windows
    ((2, 3, 10, 11, 12), _kw((1, 2, 2), (1, 3, 3), (0, 1, 1))),  # disjoint with padding
    ((2, 3, 9, 9, 9), _kw(3, 1)),  # gather
    ((1, 2, 19, 17, 70), _kw(3, 1)),  # gather, W longer than a block's runs
    ((2, 2, 9, 12, 11), _kw(3, 2, 1)),  # gather with padding
    ((1, 2, 12, 12, 12), _kw(8, 1)),  # big windows: runs on the GPU
    ((2, 3, 10, 11, 12), _kw((1, 3, 2), (1, 2, 1), (0, 1, 1), (1, 2, 1))),  # gather with dilation
    ((3, 9, 8, 7), _kw(3, 2, ceil=True)),  # 4-D input, gather with ceil_mode
    ((1, 2, 9, 10, 13), _kw(3, 2, 1, 2)),  # gather, dilated and strided along W: runs split windows
    ((2, 3, 6, 5, 3), _kw(2, 1)),  # gather, a row shorter than one run
    ((2, 3, 9, 9, 10), _kw(3, 1)),  # stride-1 gather in blocks of 4 D rows, the last block of one row
    ((2, 2, 10, 11, 16), _kw(3, 1, 1)),  # the same with padding, the last block of two rows
    ((1, 2, 11, 9, 12), _kw(3, 1, 1, 2)),  # dilated: blocks of rows 2 apart along D, the last of fewer rows
    ((1, 1, 32, 32, 40), _kw((5, 5, 3), 1, 0, (3, 3, 1))),  # gather, the runtime window dilated along D and H
    ((2, 3, 8, 9, 10), _kw(2, 3)),  # disjoint windows holding 30% of x: bwd_disjoint on the GPU
    ((2, 3, 10, 11, 13), _kw(2, 3, 1, ceil=True)),  # the same with padding
    ((1, 2, 10, 11, 9), _kw((3, 3, 5), 1, 1, (2, 2, 1), ceil=True)),  # runs: padding, D and H dilated
    ((2, 2, 8, 9, 23), _kw((5, 5, 9), (1, 1, 2), 2)),  # runs: W stride 2, 5 windows along W
    ((2, 2, 7, 8, 37), _kw((3, 3, 5), 1, (0, 0, 1), (1, 1, 2))),  # runs: W dilation 2, two classes of windows
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients(device, dtype, rng):
    cases = GRAD_CASES if dtype in ("float32", "bfloat16") else GRAD_CASES[::3]
    xs = [random_array(shape, dtype, rng) for shape, _ in cases]
    refs = [F.reference_pool(x, **kw) for x, (_, kw) in zip(xs, cases)]
    dys = [random_array(want.shape, dtype, rng) for want, _ in refs]
    grads = [grad(x, dy, dtype, **kw) for x, dy, (_, kw) in zip(xs, dys, cases)]
    jt.sync(grads)
    for (shape, kw), (_, arg), dy, g in zip(cases, refs, dys, grads):
        assert_grad_close(to_numpy64(g), F.reference_grad(shape, arg, dy), dtype, (shape, kw))


def test_gradients_are_deterministic(device, rng):
    # many windows share a maximum (few distinct values): the sums over them must not depend on timing
    x = rng.integers(0, 4, size=(4, 8, 12, 12, 12)).astype(np.float32)
    for kw in (_kw(3, 1), _kw(8, 1), _kw(2), _kw(2, ceil=True), _kw(2, 3)):
        want, arg = F.reference_pool(x, **kw)
        dy = random_array(want.shape, "float32", rng)
        first = grad(x, dy, "float32", **kw).numpy()
        second = grad(x, dy, "float32", **kw).numpy()
        assert first.tobytes() == second.tobytes()
        assert_grad_close(first, F.reference_grad(x.shape, arg, dy), "float32", kw)


def test_gradient_with_returned_indices(device, rng):
    x_np = random_array((2, 3, 9, 9, 9), "float32", rng)
    for kw in (_kw(3, 1), _kw(3)):
        x = jt.array(x_np)
        y, idx = ops.max_pool3d(x, return_indices=True, **kw)
        dy = random_array(tuple(y.shape), "float32", rng)
        got = jt.grad(InjectGrad.apply(y, jt.array(dy)).sum(), x).numpy()
        assert_grad_close(got, F.reference_grad(x_np.shape, F.reference_pool(x_np, **kw)[1], dy), "float32")


# ---- errors -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kernel_size=0), ValueError, "kernel_size"),
    (dict(kernel_size=(2, 2)), ValueError, "kernel_size"),
    (dict(kernel_size=2.0), TypeError, "kernel_size"),
    (dict(kernel_size=(2, 2, "2")), TypeError, "kernel_size"),
    (dict(kernel_size=True), TypeError, "kernel_size"),
    (dict(kernel_size=2, stride=0), ValueError, "stride"),
    (dict(kernel_size=2, stride=(1, -1, 1)), ValueError, "stride"),
    (dict(kernel_size=2, dilation=0), ValueError, "dilation"),
    (dict(kernel_size=2, padding=-1), ValueError, "padding"),
    (dict(kernel_size=2, padding=2), ValueError, "padding"),
    (dict(kernel_size=(3, 3, 1), padding=(1, 1, 1)), ValueError, "padding"),
    (dict(kernel_size=2, ceil_mode="yes"), TypeError, "ceil_mode"),
    (dict(kernel_size=9), ValueError, "kernel_size"),  # output size < 1 on an 8^3 input
    (dict(kernel_size=3, dilation=4), ValueError, "output size"),
])
def test_bad_parameters(kwargs, error, match):
    x = jt.zeros((1, 2, 8, 8, 8))
    with pytest.raises(error, match=match):
        ops.max_pool3d(x, **kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="x must be 4-D"):
        ops.max_pool3d(jt.zeros((8, 8, 8)), 2)
    with pytest.raises(ValueError, match="x must be 4-D"):
        ops.max_pool3d(jt.zeros((1, 1, 1, 8, 8, 8)), 2)
    with pytest.raises(TypeError, match="x must be a float"):
        ops.max_pool3d(jt.zeros((1, 2, 8, 8, 8), dtype="int32"), 2)
    with pytest.raises(TypeError, match="x must be a jittor Var"):
        ops.max_pool3d(np.zeros((1, 2, 8, 8, 8), np.float32), 2)
    with pytest.raises(ValueError, match="kernel_size"):
        ops.MaxPool3d(0)
    with pytest.raises(ValueError, match="direction"):
        P.select_config((1, 1, 4, 4, 4), "float32", P.normalize_params(2), "sideways")


# ---- the case table ---------------------------------------------------------------------------------------

def test_case_table_shape():
    fwd = [c for c in F.FAMILY.cases if c.direction == "fwd" and "cuda" in c.devices]
    bwd = [c for c in F.FAMILY.cases if c.direction == "bwd" and "cuda" in c.devices]
    assert len(fwd) >= 25 and len(bwd) >= 8
    assert len({c.id for c in F.FAMILY.cases}) == len(F.FAMILY.cases)
    assert {c.dtype for c in fwd} >= {"float16", "bfloat16", "float32"}
    assert any(F.FAMILY.bytes_moved(c) >= 256 * 2**20 for c in fwd)
    assert any(F.FAMILY.bytes_moved(c) >= 256 * 2**20 for c in bwd)
    for c in F.FAMILY.cases:  # every case is valid and names a variant of ours
        assert F.FAMILY.variant(c, ops) != "-" and F.FAMILY.variant(c, object()) == "-"
        assert F.FAMILY.bytes_moved(c) > 0


def test_cuda_cases_reach_every_cuda_variant():
    """The score cases reach every CUDA kernel."""
    names = set()
    for c in F.FAMILY.cases:
        if "cuda" in c.devices:
            params = P.normalize_params(**F.case_params(c))
            names.add(P.select_config(c.shapes[0], c.dtype, params, c.direction, on_cuda=True).variant)
    assert names == {v for v in P.VARIANTS["fwd"] + P.VARIANTS["bwd"] if not v.endswith("cpu")}


@pytest.mark.parametrize("params", [dict(kernel_size=8, stride=1), dict(kernel_size=3, stride=2, padding=1),
                                    dict(kernel_size=3, stride=1, dilation=2), dict(kernel_size=(2, 5, 3),
                                    stride=(2, 2, 3), dilation=(1, 2, 3)), dict(kernel_size=4, stride=3, dilation=3)])
def test_windows_per_input_is_the_most_any_element_is_in(params):
    """Counted by brute force over a shape large enough to reach the steady state: the backward's tolerance
    grows with this count (float32 summation of that many dy values)."""
    c = F._c("count", "bwd", (1, 1, 40, 40, 40), **params)
    pp = P.normalize_params(**F.case_params(c))
    k, s, p, d = pp.kernel, pp.stride, pp.padding, pp.dilation
    per_dim = []
    for a in range(3):
        counts = np.zeros(40, dtype=int)
        for o in range(F._out_size(40, k[a], s[a], p[a], d[a], False)):
            for j in range(k[a]):
                i = o * s[a] - p[a] + j * d[a]
                if 0 <= i < 40:
                    counts[i] += 1
        per_dim.append(counts.max())
    assert F.windows_per_input(c) == int(np.prod(per_dim))
    rtol, atol = F.FAMILY.tolerance(c)
    assert (rtol, atol) == (1e-5, 1e-6 + 4 * 2.0 ** -24 * int(np.prod(per_dim)))
    assert F.FAMILY.tolerance(F._c("count", "fwd", (1, 1, 40, 40, 40), **params)) == DEFAULT_TOLERANCE["float32"]


def test_cpu_cases_match_the_reference():
    previous = jt.flags.use_cuda
    jt.flags.use_cuda = 0
    try:
        _check_cpu_cases(np.random.default_rng(0))
    finally:
        jt.flags.use_cuda = previous


def _check_cpu_cases(rng):
    for c in F.FAMILY.cases:
        if "cpu" not in c.devices:
            continue
        arrays = F.FAMILY.make_inputs(c, rng)
        xs = [to_jittor(a, c.dtype) for a in arrays]
        rtol, atol = F.FAMILY.tolerance(c)
        if c.direction == "fwd":
            got = to_numpy64(F.FAMILY.forward(c, ops, xs)[0])
            np.testing.assert_allclose(got, F.FAMILY.reference_forward(c, arrays)[0], rtol=rtol, atol=atol)
        else:
            y = F.FAMILY.forward(c, ops, xs)[0]
            dy = random_array(tuple(y.shape), c.dtype, rng)
            got = to_numpy64(jt.grad(InjectGrad.apply(y, to_jittor(dy, c.dtype)).sum(), xs[0]))
            want = F.FAMILY.reference_backward(c, arrays, [dy])[0]
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=c.id)


def test_naive_composite_matches_the_reference():
    c = next(c for c in F.FAMILY.cases if c.name == "cpu_k3s2p1" and c.direction == "fwd")
    x = random_array(c.shapes[0], "float32", np.random.default_rng(1))
    got = F.FAMILY.naive_forward(c, [jt.array(x)])[0].numpy()
    np.testing.assert_array_equal(got, F.FAMILY.reference_forward(c, [x])[0])


# ---- GPU-sized dispatch paths (cuda only) -----------------------------------------------------------------

# The layouts every forward kernel and the gather meet (the comments name the forward's variant).
GPU_CASES = [
    ((8, 32, 32, 64, 64), "float32", _kw(2)),  # fwd_k2s2_vec vec4 (128 MB)
    ((16, 64, 16, 56, 56), "float16", _kw(2)),  # vec8
    ((2, 32, 32, 64, 64), "float64", _kw(2)),  # vec2 (16 bytes)
    ((8, 32, 32, 62, 62), "bfloat16", _kw(2)),  # vec2 (4 bytes)
    ((4, 32, 32, 32, 32), "float32", _kw(3, 1)),  # fwd_flat k3 nopad, bwd_gather
    ((8, 64, 16, 56, 56), "float16", _kw(3, 2, 1)),  # fwd_flat k3 padded
    ((2, 16, 32, 32, 32), "float32", _kw(8, 1)),  # fwd_flat k8, gather with 512 candidates
    ((64, 64, 8, 8, 8), "bfloat16", _kw(8)),  # fwd_warp
    ((16, 32, 33, 8, 8), "float32", _kw((2, 8, 8), ceil=True)),  # fwd_warp padded
    ((16, 32, 33, 8, 8), "float32", _kw((2, 8, 8))),  # floor mode's remainder
    ((8, 32, 31, 63, 63), "float32", _kw(2, ceil=True)),  # fwd_flat clamped
    ((8, 32, 31, 64, 64), "float16", _kw(2)),  # a remainder along D only (no vectors)
    ((8, 32, 32, 63, 63), "float32", _kw(2, 3)),  # gaps between windows
    ((16, 32, 33, 8, 8), "bfloat16", _kw((2, 8, 8), (3, 8, 8))),  # warp with gaps
    ((4, 32, 32, 64, 64), "float32", _kw(4)),  # generic window
    ((4, 16, 32, 32, 32), "float32", _kw(3, 2, 1, 2)),  # dilation
]


@pytest.mark.cuda
@pytest.mark.parametrize("shape, dtype, kw", GPU_CASES)
def test_gpu_sized_paths(shape, dtype, kw):
    rng = np.random.default_rng(7)
    previous = jt.flags.use_cuda
    jt.flags.use_cuda = 1
    try:
        x = random_array(shape, dtype, rng)
        want, arg = F.reference_pool(x, **kw)
        got, idx = pool(x, dtype, **kw)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(idx, arg)
        dy = random_array(want.shape, dtype, rng)
        first = grad(x, dy, dtype, **kw)
        second = grad(x, dy, dtype, **kw)
        assert first.numpy().tobytes() == second.numpy().tobytes()
        abs_sum = F.reference_grad(shape, arg, np.abs(dy.astype(np.float64)))
        assert_grad_close(to_numpy64(first), F.reference_grad(shape, arg, dy), dtype, f"{shape} {kw}", abs_sum,
                          terms=math.prod(P.normalize_params(**kw).kernel))
    finally:
        jt.flags.use_cuda = previous


# ---- nvcc: every menu compiles for sm_90 -------------------------------------------------------------------

# (dtype, menus) compiled by the nvcc test: every menu once, and the value menus of every element size and type
NVCC_MENUS = (("float32", ("values", "both", "gather")), ("float16", ("values", "gather")),
              ("bfloat16", ("values",)), ("float64", ("values", "both")))
_MENU_CALLS = {
    "values": "pool3d_fwd_values_menu<{T}, int>(0, ({T}*)0, ({T}*)0, (int*)0, g, 1);",
    "both": "pool3d_fwd_both_menu<{T}, int>(0, ({T}*)0, ({T}*)0, (int*)0, g, 1);",
    "gather": "pool3d_bwd_gather_menu<{T}, int>(0, (int*)0, ({T}*)0, ({T}*)0, g, 1);",
}


@pytest.mark.nvcc
@pytest.mark.parametrize("dtype, names", NVCC_MENUS)
def test_nvcc_compiles_every_menu(dtype, names):
    from nvcc_util import compile_check

    itemsize = ops._codegen.ITEMSIZE[dtype]
    menus = P.menus(itemsize)
    header = ("#include <iostream>\n#define LOGf std::cerr\n"
              + ops._codegen.header(["common", "pool3d", "pool3d_gather"]) + "\n"
              + "\n".join(menus[n].render(P._MENU_HEADS[n], n) for n in names))
    body = "Pool3dGeom g = {};\n" + "\n".join(_MENU_CALLS[n].format(T=dtype) for n in names)
    ok, log = compile_check(header, body)
    assert ok, log[-6000:]


@pytest.mark.nvcc
def test_the_backward_timing_program_builds_for_every_dtype_of_the_table(tmp_path):
    """tests/pool3d_bwd_ab.py (the backward kernels timed without jittor) builds its program for each dtype of the
    grader's backward cases, each layer calling the menu entry the dispatcher picks."""
    import pool3d_bwd_ab

    assert pool3d_bwd_ab.main(["--build-only", "--keep", str(tmp_path)]) == 0
    layers = pool3d_bwd_ab._layers("")
    dtypes = {c.dtype for c, _, _ in layers}
    assert dtypes == {"float32", "float16", "bfloat16"}
    listed = (tmp_path / pool3d_bwd_ab.MANIFEST).read_text().split()
    assert sorted(listed[1::2]) == sorted(f"1-cuda_snippets-{dtype}" for dtype in dtypes)
    for dtype in dtypes:
        assert os.access(tmp_path / f"1-cuda_snippets-{dtype}", os.X_OK)
        source = (tmp_path / f"1-cuda_snippets-{dtype}.cu").read_text()
        for c, _, cfg in layers:
            if c.dtype == dtype:
                assert f'{{"{c.name} {cfg.variant}", {P.menu_index(cfg, dtype)}, ' in source


def test_the_backward_timing_program_runs_what_a_build_listed(tmp_path, capsys):
    """--run DIR runs the programs a build listed and puts the builds' times side by side, the first as the base."""
    import pool3d_bwd_ab

    for number, ms in (("1", "0.0400"), ("2", "0.0300")):
        script = tmp_path / f"prog{number}"
        script.write_text(f"#!/bin/sh\nprintf 'k3s1 bwd_gather\\t{ms}\\tthe host sum\\047s bits\\n'\n")
        script.chmod(0o755)
    (tmp_path / pool3d_bwd_ab.MANIFEST).write_text("1:base\tprog1\n2:changed\tprog2\n")
    assert pool3d_bwd_ab.main(["--run", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "case (variant)\t1:base ms\t2:changed ms\tdx"
    assert lines[1] == "k3s1 bwd_gather\t0.0400\t0.0300 (0.75x)\tthe host sum's bits"


def test_every_variant_is_in_a_menu():
    entries = {e[0] for itemsize in (2, 4, 8) for m in P.menus(itemsize).values() for e in m.entries}
    assert entries == {v for v in P.VARIANTS["fwd"] + P.VARIANTS["bwd"] if not v.endswith("cpu")}


def test_gather_loads_follow_the_compile_time_window():
    """A compile-time window of GATHER_LOADS launches with its way of loading (REACH only for stride 1); every
    other gather, the run-time window's among them (no compile-time bound on a row's windows), loads on demand."""
    assert set(P.GATHER_LOADS) <= set(P.GATHER_WINDOWS)
    assert set(P.GATHER_LOADS.values()) == {"POOL3D_LOADS_ROW", "POOL3D_LOADS_ALL", "POOL3D_LOADS_REACH"}
    assert all(w[1] == (1, 1, 1) for w, loads in P.GATHER_LOADS.items() if loads == "POOL3D_LOADS_REACH")
    assert {w for w, _, _ in P.GATHER_ON_DEMAND} <= set(P.GATHER_LOADS)
    seen = set()
    for itemsize in (2, 4, 8):
        for entry in P.menus(itemsize)["gather"].entries:
            if entry[0] == "bwd_gather":
                _, window, run, rows = entry
                loads = P.gather_loads(window, itemsize, run)
                if window is None or (window, itemsize, run) in P.GATHER_ON_DEMAND:
                    assert loads == "POOL3D_LOADS_ON_DEMAND", entry
                else:
                    assert loads == P.GATHER_LOADS.get(window, "POOL3D_LOADS_ON_DEMAND"), entry
                call = P._call(entry, itemsize=itemsize)
                if loads == "POOL3D_LOADS_REACH":  # a thread per block of rows
                    assert rows == P.GATHER_REACH_ROWS, entry
                else:
                    assert rows == (1, 1), entry
                assert f", {run}, {loads}, {rows[0]}, {rows[1]}, " in call, entry
                seen.add(loads)
    assert len(seen) == 4


@pytest.mark.parametrize("shape, dtype, kw, loads, vec", [  # REACH: a thread per block of GATHER_REACH_ROWS rows
    ((4, 32, 32, 32, 32), "float32", _kw(3, 1), "POOL3D_LOADS_REACH", 4),
    ((4, 32, 32, 32, 32), "float16", _kw(3, 1), "POOL3D_LOADS_REACH", 8),
    ((4, 32, 32, 32, 32), "float32", _kw(2, 1), "POOL3D_LOADS_REACH", 8),
    ((4, 32, 32, 32, 32), "float32", _kw(3, 1, d=2), "POOL3D_LOADS_REACH", 8),
    ((4, 32, 32, 32, 31), "float32", _kw(3, 1, d=2), "POOL3D_LOADS_ON_DEMAND", 4),  # runs of 4: on demand
    ((4, 32, 32, 32, 32), "float64", _kw(3, 1, d=2), "POOL3D_LOADS_REACH", 2),
    ((4, 32, 32, 32, 32), "float16", _kw(3, 1, d=2), "POOL3D_LOADS_REACH", 8),
    ((4, 32, 32, 32, 32), "float32", _kw(3, 1, 1), "POOL3D_LOADS_REACH", 4),
    ((8, 32, 16, 56, 56), "float32", _kw(3, 1, 1), "POOL3D_LOADS_REACH", 4),
    ((4, 32, 32, 32, 32), "float64", _kw(3, 1, 1), "POOL3D_LOADS_REACH", 2),
    ((4, 32, 32, 32, 33), "float32", _kw(2, 1), "POOL3D_LOADS_REACH", 4),
    ((2, 3, 1, 32, 32), "float32", _kw((1, 3, 3), 1, (0, 1, 1)), "POOL3D_LOADS_ON_DEMAND", 4),  # run-time window
    ((4, 32, 32, 64, 64), "float32", _kw(3, 1), "POOL3D_LOADS_REACH", 4),  # rows of 62
    ((8, 64, 16, 56, 56), "bfloat16", _kw(3, 2, 1), "POOL3D_LOADS_ROW", 8),
    ((8, 32, 32, 64, 64), "float32", _kw(2), "POOL3D_LOADS_ALL", 8),
    ((8, 32, 16, 64, 64), "bfloat16", _kw((1, 3, 3), (1, 2, 2), (0, 1, 1)), "POOL3D_LOADS_ALL", 8),
    ((4, 32, 32, 64, 64), "float32", _kw(4), "POOL3D_LOADS_ON_DEMAND", 8),
    ((4, 32, 32, 64, 64), "float32", _kw(4, 2), "POOL3D_LOADS_ON_DEMAND", 8),  # run-time window
])
def test_dispatcher_picks_the_gathers_loads(shape, dtype, kw, loads, vec):
    cfg = _select(shape, dtype, kw, "bwd", True)
    assert (cfg.variant, cfg.vec) == ("bwd_gather", vec)
    call = P._call(P._entry(cfg), itemsize=ops._codegen.ITEMSIZE[dtype])
    if loads == "POOL3D_LOADS_REACH":
        assert cfg.rows == P.GATHER_REACH_ROWS and cfg.name.endswith("/rows%dx%d" % P.GATHER_REACH_ROWS)
    else:
        assert cfg.rows == (1, 1)
    assert ", %d, %s, %d, %d, " % ((vec, loads) + cfg.rows) in call


def test_every_stride_one_layer_finds_its_gather_in_the_menu():
    """Every layer of a REACH window, of any width, padding and element size, finds the block entry the dispatcher
    picks in its menu."""
    for window, loads in P.GATHER_LOADS.items():
        if loads != "POOL3D_LOADS_REACH":
            continue
        kernel, stride, dilation = window
        for dtype in ("float16", "float32", "float64"):
            for width in range(8, 41):
                for pad in range(kernel[2] // 2 + 1):
                    kw = _kw(kernel, stride, pad, dilation)
                    if P.output_shape((9, 9, width), P.normalize_params(**kw))[2] < 1:
                        continue
                    cfg = _select((2, 9, 9, width), dtype, kw, "bwd", True)
                    P.menu_index(cfg, dtype)  # raises where the entry is missing
                    on_demand = (window, ops._codegen.ITEMSIZE[dtype], cfg.vec) in P.GATHER_ON_DEMAND
                    assert cfg.window == window, (window, dtype, width, pad)
                    assert cfg.rows == ((1, 1) if on_demand else P.GATHER_REACH_ROWS), (window, dtype, width, pad)


@pytest.fixture
def menus_rebuilt():
    """Forget the rendered menus and plans before and after the test, which changes what they hold; the test gets
    the function that forgets them, for its own changes in between."""
    def forget():
        P.menus.cache_clear()
        P.cuda_header.cache_clear()
        ops._launch.reload_switches()  # forget the plans: the next calls plan again
    forget()
    yield forget
    forget()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_the_gather_in_blocks_of_rows_gives_the_one_row_gathers_bits(dtype, monkeypatch, menus_rebuilt, on_gpu,
                                                                      rng):
    """A stride-1 REACH gather takes a run of each row of a block of GATHER_REACH_ROWS (D, H) rows a thread; it sums
    each element's windows in the one-row gather's order: the same bits, with ties, padding, dilation, blocks cut
    short by D and H, and W runs of 4 and 8 (float32 k3s1d2). (Every block shape's work items against the one-row
    gather on the CPU: tests/test_cpu_path.py; each shape here would compile three more menus.)"""
    layers = [((2, 3, 9, 9, 10), _kw(3, 1)), ((2, 2, 10, 11, 16), _kw(3, 1, 1)), ((2, 2, 7, 10, 17), _kw(2, 1)),
              ((1, 2, 11, 13, 24), _kw(3, 1, 1, 2))]
    xs = []
    for shape, kw in layers:
        x = random_array(shape, dtype, rng)
        x.reshape(-1)[::5] = x.reshape(-1)[1]  # ties
        xs.append(x)
    dys = [random_array(F.reference_pool(x, **kw)[0].shape, dtype, rng) for x, (_, kw) in zip(xs, layers)]
    found, block = {}, P.GATHER_REACH_ROWS
    for rows in ((1, 1), block):
        monkeypatch.setattr(P, "GATHER_REACH_ROWS", rows)
        menus_rebuilt()
        assert {_select(shape, dtype, kw, "bwd", True).rows for shape, kw in layers} == {rows}
        found[rows] = [grad(x, dy, dtype, **kw).numpy().tobytes() for x, dy, (_, kw) in zip(xs, dys, layers)]
    assert block != (1, 1) and found[block] == found[(1, 1)]


@pytest.mark.parametrize("kw", [_kw(2), _kw(3, 2, 1), _kw((1, 3, 3), (1, 2, 2), (0, 1, 1))])
def test_grad_source_is_the_backward_kernel_bit_for_bit(device, kw, rng):
    """The backward runs as the forward's grad source (no Python): jt.grad gives exactly what the backward
    kernel gives when launched by hand on x, dy, y and the saved indices."""
    x = to_jittor(random_array((2, 3, 9, 10, 12), "float32", rng), "float32")
    y = ops.max_pool3d(x, **kw)
    dy = to_jittor(random_array(tuple(y.shape), "float32", rng), "float32")
    got = jt.grad(InjectGrad.apply(y, dy).sum(), x)
    plan = P.plan(tuple(x.shape), "float32", P.normalize_params(**kw), False, True, device == "cuda")
    launch = plan.launch
    kwargs = {k.replace("grad_src", "src"): (v[0] if k.endswith("grad_src") else v)
              for k, v in launch.kwargs.items() if k.endswith(("grad_src", "header", "data"))}
    src_key = "cuda_src" if device == "cuda" else "cpu_src"
    header_key = src_key.replace("src", "header")
    aliases = "@alias(dout,in1)\n@alias(pout0,in2)\n@alias(pout1,in3)\n@alias(pout,in2)\n"
    kwargs[header_key] = aliases + kwargs[header_key]
    y_values, idx = ops.max_pool3d(x, return_indices=True, **kw)
    want = jt.code(x.shape, x.dtype, [x, dy, y_values, idx], **kwargs)
    assert got.numpy().tobytes() == want.numpy().tobytes()


def test_the_judges_argmax_is_kept_per_input_array():
    """A backward's timed calls vary dy only: the judge's reference reuses the argmax of the same x array, and
    only of the same array with the same parameters."""
    from ops.scoring import fam_pool3d as P
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 6, 7, 5))
    params = dict(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)
    first = P.argmax_of(x, params)
    np.testing.assert_array_equal(first, P.reference_pool(x, **params)[1])
    assert P.argmax_of(x, params) is first
    other = P.argmax_of(x, dict(params, stride=1))
    assert other is not first and other.shape != first.shape
    same_values = x.copy()
    assert P.argmax_of(same_values, params) is not first
    np.testing.assert_array_equal(P.argmax_of(same_values, params), first)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=1), dict(kernel_size=3, stride=2,
                                padding=1, ceil_mode=True), dict(kernel_size=2, stride=3), dict(kernel_size=2,
                                stride=1, dilation=2)])
def test_the_judges_sampled_backward_references_are_the_whole_ones_there(dtype, kw, rng):
    """A max_pool3d backward's references of sampled elements (Family.expected_at: the call's dy read at the
    windows whose argmax is sampled) equal the whole reference's values and bounds at those positions, and
    judge the whole reference's samples right and zeros wrong."""
    from ops.scoring import prepare
    from ops.scoring.fresh import call_number
    from ops.scoring.judge import judge
    from ops.scoring.families import load_families
    from ops.scoring.spec import Case, edge_array, random_array
    (fam,) = load_families(["max_pool3d"])
    c = Case("max_pool3d", "t", "bwd", ((2, 3, 9, 8, 10),), dtype, tuple(kw.items()))
    x = edge_array((2, 3, 9, 8, 10), dtype, rng)
    dy = random_array(fam.output_shapes(c)[0], dtype, rng)
    prepared = prepare.Prepared("", [([x], [dy])], [None], [0], seed=int(rng.integers(1 << 30)))
    number = call_number(0, 17)
    positions = [rng.integers(0, x.size, size=64).astype(np.int32)]
    whole = fam.expected(c, *prepared.call_inputs(fam, c, 0, number))[0].take(positions[0].astype(np.int64))
    (at,) = fam.expected_at(c, [x], [dy], [positions[0].astype(np.int64)], prepared.varied_at(c, 0, number))
    assert at.kind == whole.kind and at.dtypes == whole.dtypes
    np.testing.assert_array_equal(at.value, whole.value)
    if whole.kind == "rounded":
        np.testing.assert_array_equal(at.bound, whole.bound)
    host = np.float32 if dtype == "bfloat16" else dtype
    assert judge(np.asarray(whole.value, dtype=host), dtype, at)[0]
    if np.count_nonzero(np.nan_to_num(whole.value)):
        assert not judge(np.zeros(64, host), dtype, at)[0]


def _shfl_up(a, d):
    """__shfl_up_sync over 32 lanes: lane i gets lane i - d's value, lanes below d their own."""
    return np.concatenate([a[:d], a[:-d]])


def runs_row_emulated(keys, dy, W, heads, sums, lanes=32):
    """bwd_runs' pass 1 for one output row (pool3d_gather.cuh), lane for lane: chunks of 32 windows, a window
    without an argmax filled with the key before it (adding -0), a segmented scan by key, the run open at a
    chunk's end carried into the next. Writes ``heads``/``sums`` at each run's argmax column, asserting that no
    column is written twice."""
    Wo = len(keys)
    lane = np.arange(lanes)
    carry_key, carry = -1, 0.0

    def keep(k, v):
        assert heads[k % W] == -1, "two runs of a row end at one column"
        heads[k % W], sums[k % W] = k, v

    for base in range(0, Wo, lanes):
        ow = base + lane
        inside = ow < Wo
        key = np.where(inside, keys[np.minimum(ow, Wo - 1)], -1)
        v = np.where(key >= 0, dy[np.minimum(ow, Wo - 1)], -0.0)
        last = np.where(key >= 0, lane, -1)
        d = 1
        while d < lanes:
            up = _shfl_up(last, d)
            last = np.where((lane >= d) & (up > last), up, last)
            d *= 2
        key = np.where(last < 0, carry_key, key[np.maximum(last, 0)])
        if key[0] == carry_key:
            v[0] = carry + v[0]
        d = 1
        while d < lanes:
            up, up_key = _shfl_up(v, d), _shfl_up(key, d)
            v = np.where((lane >= d) & (up_key == key), v + up, v)
            d *= 2
        if carry_key >= 0 and key[0] != carry_key:
            keep(carry_key, carry)
        ends = np.append(key[1:] != key[:-1], base + lanes >= Wo)
        for i in np.flatnonzero(ends & (key >= 0)):
            keep(key[i], v[i])
        carry_key, carry = key[-1], v[-1]


def emulation_operands(x_shape, arg, dy, kw):
    """What a backward emulation reads: the input and output planes' sizes, the indices and float64 dy per plane,
    and the pooling parameters."""
    Do, Ho, Wo = arg.shape[-3:]
    p = P.normalize_params(kw["kernel_size"], kw.get("stride"), kw.get("padding", 0), kw.get("dilation", 1),
                           kw.get("ceil_mode", False))
    return (tuple(x_shape[-3:]), (Do, Ho, Wo), arg.reshape(-1, Do, Ho, Wo),
            np.asarray(dy, dtype=np.float64).reshape(-1, Do, Ho, Wo), p)


def runs_backward_emulated(x_shape, arg, dy, kw, lanes=32):
    """bwd_runs (pool3d_gather.cuh) in NumPy: pass 1 (runs_row_emulated) keeps, per output row (plane, od, oh),
    W class of windows and input column w, the dy sum of the run of consecutive windows whose argmax has that
    column (a row has at most one such run per column: the assertion); pass 2 sums, for each input element,
    the kept sums of the rows whose windows can hold it where the kept argmax is the element."""
    (D, H, W), (Do, Ho, Wo), a, g, p = emulation_operands(x_shape, arg, dy, kw)
    planes = a.shape[0]
    classes = p.dilation[2] // math.gcd(p.stride[2], p.dilation[2])  # pool3d_w_classes
    sums = np.zeros((planes, Do, Ho, W))
    heads = np.full((planes, Do, Ho, W), -1, dtype=np.int64)
    for pl in range(planes):
        for od in range(Do):
            for oh in range(Ho):
                for c in range(classes):
                    runs_row_emulated(a[pl, od, oh, c::classes], g[pl, od, oh, c::classes], W, heads[pl, od, oh],
                                      sums[pl, od, oh], lanes)

    def rows_holding(t, n_out, k, s, pad, dl):
        return [o for o in range(n_out) if (t + pad - o * s) % dl == 0 and 0 <= (t + pad - o * s) // dl < k]

    (kd, kh, _), (sd, sh, _), (pd, ph, _), (dd, dh, _) = p.kernel, p.stride, p.padding, p.dilation
    # what pass 1 stores of a head: the argmax's place (kz, ky) in its row's windows, kz * kh + ky (pool3d_runs_head)
    od_of, oh_of = np.meshgrid(np.arange(Do), np.arange(Ho), indexing="ij")
    kz = (heads // (H * W) + pd - od_of[None, :, :, None] * sd) // dd
    ky = (heads // W % H + ph - oh_of[None, :, :, None] * sh) // dh
    codes = np.where(heads >= 0, kz * kh + ky, P.RUNS_NO_HEAD)
    assert np.all((heads < 0) | ((kz >= 0) & (kz < kd) & (ky >= 0) & (ky < kh))), "a head outside its windows"
    dx = np.zeros((planes, D, H, W))
    for d in range(D):
        for h in range(H):
            for od in rows_holding(d, Do, kd, sd, pd, dd):
                for oh in rows_holding(h, Ho, kh, sh, ph, dh):
                    mine = codes[:, od, oh, :] == (d + pd - od * sd) // dd * kh + (h + ph - oh * sh) // dh
                    dx[:, d, h, :] += np.where(mine, sums[:, od, oh, :], 0.0)
    return dx.reshape(x_shape)


@pytest.mark.parametrize("shape, kw", [((2, 3, 7, 8, 9), _kw(3, 1)), ((1, 2, 9, 9, 10), _kw(8, 1)),
                                       ((2, 2, 8, 9, 11), _kw(3, (1, 1, 2), 1)), ((2, 2, 9, 8, 10), _kw(4, 1, 2)),
                                       ((1, 2, 10, 11, 9), _kw(3, 1, 1, (2, 2, 1), ceil=True)),
                                       ((2, 2, 6, 7, 8), _kw((2, 3, 5), (1, 2, 1), (1, 1, 2))),
                                       ((1, 1, 4, 4, 75), _kw(3, 1, 1)), ((2, 2, 7, 8, 11), _kw(3, 1, 0, 2)),
                                       ((1, 2, 7, 8, 12), _kw(3, 2, 1, 2)), ((1, 2, 6, 7, 13), _kw(4, 1, 1, (1, 1, 3))),
                                       ((1, 1, 4, 4, 80), _kw(3, 1, 0, (1, 1, 2), ceil=True))])
@pytest.mark.parametrize("lanes", [32, 4])
@pytest.mark.parametrize("values", ["ties", "edge"])
def test_the_runs_backward_is_the_reference_gradient(shape, kw, values, lanes, rng):
    """The two-pass backward of overlapping windows (bwd_runs), emulated: each W class of a row of windows (one
    class where W's dilation is 1, dilation / gcd(stride, dilation) otherwise) has one run per argmax column
    (windows sharing an argmax are consecutive; argmax columns never go back), so pass 1's kept sums lose nothing
    and pass 2 finds each element's among its candidate rows. Ties (few values), NaN and -inf (edge inputs),
    padding and W dilation included; rows longer than a warp (W = 75, 80), and 4-lane warps, carry runs across
    chunks."""
    check_emulated_backward(lambda arg, dy: runs_backward_emulated(shape, arg, dy, kw, lanes), shape, kw, values, rng)


def check_emulated_backward(emulated, shape, kw, values, rng):
    """``emulated(arg, dy)`` (a backward kernel's emulation) is the reference gradient of max pooling x of
    ``shape`` with ``kw``: x of few values (``values`` "ties") or with NaN and -inf ("edge")."""
    from ops.scoring.spec import edge_array
    x = (rng.integers(0, 3, size=shape).astype(np.float32) if values == "ties"
         else edge_array(shape, "float32", rng, density=0.1))
    _, arg = F.reference_pool(x, **kw)
    dy = rng.standard_normal(arg.shape)
    np.testing.assert_allclose(emulated(arg, dy), F.reference_grad(shape, arg, dy), rtol=1e-12, atol=1e-12)


@pytest.mark.nvcc
def test_the_runs_heads_of_both_passes_agree():
    """bwd_runs' heads (host code built by nvcc and run here): for random windows and every output row, the head
    pass 1 keeps for each element a row's windows hold (pool3d_runs_head, from its index) is the one pass 2 looks
    for (pool3d_runs_head_of, from its row), distinct elements of the row have distinct heads, and every head is
    below kd * kh and so below POOL3D_RUNS_NO_HEAD where the dispatcher takes bwd_runs."""
    from nvcc_util import run_host
    body = r"""
  unsigned seed = 12345u;
  auto next = [&](int n) { seed = seed * 1664525u + 1013904223u; return (int)((seed >> 8) % (unsigned)n); };
  int bad = 0, checked = 0;
  for (int t = 0; t < 300; ++t) {
    Pool3dGeom g = {};
    g.kd = 1 + next(5); g.kh = 1 + next(5); g.kw = 1 + next(3);
    g.sd = 1 + next(3); g.sh = 1 + next(3); g.sw = 1;
    g.dd = 1 + next(3); g.dh = 1 + next(3); g.dw = 1;
    g.pd = next(g.kd / 2 + 1); g.ph = next(g.kh / 2 + 1); g.pw = 0;
    g.D = (g.kd - 1) * g.dd + 1 + next(6); g.H = (g.kh - 1) * g.dh + 1 + next(6); g.W = 1 + next(4);
    g.Do = (g.D + 2 * g.pd - (g.kd - 1) * g.dd - 1) / g.sd + 1; g.Ho = (g.H + 2 * g.ph - (g.kh - 1) * g.dh - 1) / g.sh + 1;
    g.Wo = g.W;
    const Pool3dWinR win = {g.kd, g.kh, g.kw, g.sd, g.sh, g.sw, g.dd, g.dh, g.dw};
    const Pool3dGatherDims gd = {g.H, g.W, g.Do, g.Ho, g.Wo, g.pd, g.ph, g.pw};
    for (int od = 0; od < g.Do; ++od)
      for (int oh = 0; oh < g.Ho; ++oh) {
        int seen[256] = {0};
        for (int kz = 0; kz < g.kd; ++kz)
          for (int ky = 0; ky < g.kh; ++ky) {
            const int id = od * g.sd - g.pd + kz * g.dd, ih = oh * g.sh - g.ph + ky * g.dh;
            if (id < 0 || id >= g.D || ih < 0 || ih >= g.H) continue;
            const int w = next(g.W), key = (id * g.H + ih) * g.W + w;
            const int h1 = pool3d_runs_head(g, key, od, oh), h2 = pool3d_runs_head_of(win, gd, id, ih, od, oh);
            ++checked;
            if (h1 != h2 || h1 >= g.kd * g.kh || seen[h1]++) ++bad;
          }
      }
  }
  std::printf("%d %d\n", checked, bad);
"""
    header = "#include <iostream>\n#define LOGf std::cerr\n" + ops._codegen.header(["common", "pool3d",
                                                                                       "pool3d_gather"])
    ok, printed = run_host(header, body)
    assert ok, printed[-4000:]
    checked, bad = map(int, printed.split())
    assert checked > 1000 and bad == 0


@pytest.mark.parametrize("lanes", [32, 4, 2])
def test_a_window_without_an_argmax_joins_the_run_before_it(lanes):
    """bwd_runs' pass 1 where windows have no argmax (-1): they neither split a run (which would write its column
    twice) nor add to it, at a row's start, inside a run, across chunks and at its end."""
    keys = np.array([-1, 5, 5, -1, 5, 6, 6, -1, -1, 6, 7, -1, 9, 9, -1])
    dy = np.arange(1.0, len(keys) + 1)
    heads, sums = np.full(10, -1), np.zeros(10)
    runs_row_emulated(keys, dy, 10, heads, sums, lanes)
    want = {k: dy[keys == k].sum() for k in (5, 6, 7, 9)}
    assert {int(k): s for k, s in zip(heads, sums) if k >= 0} == want
