"""The grader's references and expectations on inputs with ties, NaN, +-Inf and -0.0."""
import time

import numpy as np
import pytest

import ops
from ops._jittor import jt
from ops.scoring import fam_broadcast, fam_permute, fam_pool3d, fam_timex, harness
from ops.scoring.harness import InjectGrad, to_jittor, to_numpy
from ops.scoring.judge import judge
from ops.scoring.spec import ReferenceSkipped


def test_direct_timex_matches_the_fft_reference_on_finite_data(rng):
    w, k, g = rng.uniform(-1, 1, (3, 50)), rng.uniform(-1, 1, (2, 3, 50)), rng.uniform(-1, 1, (2, 3, 50))
    np.testing.assert_allclose(fam_timex.direct_timex(w, k, 0.3), fam_timex.reference_timex(w, k, 0.3),
                               rtol=0, atol=1e-12)
    for direct, fft in zip(fam_timex.direct_timex_grads(w, k, g), fam_timex.reference_timex_grads(w, k, g)):
        np.testing.assert_allclose(direct, fft, rtol=0, atol=1e-12)


def test_direct_timex_is_causal_and_ieee():
    T = 12
    w, k = np.ones((1, T)), np.ones((1, 1, T))
    k[0, 0, 5] = np.nan
    out = fam_timex.direct_timex(w, k)[0, 0]
    assert not np.isnan(out[:5]).any() and np.isnan(out[5:]).all()
    k[0, 0, 5], w[0, T - 1 - 2] = np.inf, 0.0  # the term at lag 2 is 0 * Inf = NaN, only where it is a term
    out = fam_timex.direct_timex(w, k)[0, 0]
    assert np.isfinite(out[:5]).all() and np.isposinf(out[5:7]).all()
    assert np.isnan(out[7]) and np.isposinf(out[8:]).all()
    g = np.zeros((1, 1, T))
    g[0, 0, 7] = np.nan
    grad_w, grad_k = fam_timex.direct_timex_grads(w, np.ones((1, 1, T)), g)
    assert np.isnan(grad_k[0, 0, :8]).all() and np.isfinite(grad_k[0, 0, 8:]).all()  # grad_k[u] sums t >= u
    assert np.isnan(grad_w[0, T - 8:]).all() and np.isfinite(grad_w[0, :T - 8]).all()  # lags 0..7


def test_max_pool3d_reference_on_ties_nan_and_signed_zero():
    x = np.array([[[[[-0.0, 0.0], [1.0, 1.0]], [[np.nan, 2.0], [np.nan, 3.0]]]]])  # (1,1,2,2,2)
    values, arg = fam_pool3d.reference_pool(x, (1, 2, 2))
    assert np.signbit(values[0, 0, 0, 0, 0]) is np.False_ or values[0, 0, 0, 0, 0] == 1.0
    assert values[0, 0, 0, 0, 0] == 1.0 and arg[0, 0, 0, 0, 0] == 2  # ties keep the first maximum
    assert np.isnan(values[0, 0, 1, 0, 0]) and arg[0, 0, 1, 0, 0] == 6  # the last NaN
    v, a = fam_pool3d.reference_pool(np.array([[[[[-0.0, 0.0]]]]]), (1, 1, 2))
    assert np.signbit(v[0, 0, 0, 0, 0]) and a[0, 0, 0, 0, 0] == 0  # -0.0 == 0.0: the first one, with its sign


def _grade_in_process(fam, c, rng):
    arrays = fam.make_inputs(c, rng)
    xs = [to_jittor(a, c.dtype if a.dtype.kind == "f" else str(a.dtype)) for a in arrays]
    if c.direction == "fwd":
        outs, expected = fam.forward(c, ops, xs), fam.expected(c, arrays)
    else:
        ys, grads = fam.forward(c, ops, xs), fam.make_grads(c, rng)
        loss = sum(InjectGrad.apply(y, to_jittor(g, c.dtype)).sum() for y, g in zip(ys, grads))
        outs, expected = jt.grad(loss, [xs[i] for i in c.grad_of]), fam.expected(c, arrays, grads)
    assert len(outs) == len(expected)
    return [judge(to_numpy(o), str(o.dtype), e) for o, e in zip(outs, expected)]


@pytest.mark.parametrize("c", [c for fam in (fam_pool3d, fam_permute, fam_broadcast) for c in fam.FAMILY.edge_cases
                               if "cpu" in c.devices], ids=lambda c: c.id)
def test_ops_passes_the_edge_cases_on_the_cpu(c, rng):
    """ops' CPU paths keep NaN, infinities, ties and the sign of zero as the references define them (timex's
    edge cases are graded by get_score.py only)."""
    fam = {"max_pool3d": fam_pool3d, "permute": fam_permute, "expand_as": fam_broadcast}[c.family].FAMILY
    for ok, err, why in _grade_in_process(fam, c, rng):
        assert ok, why


def test_every_family_has_edge_cases_on_both_devices():
    for fam in (fam_pool3d, fam_permute, fam_broadcast, fam_timex):
        edge = fam.FAMILY.edge_cases
        assert any("cpu" in c.devices for c in edge) and any("cuda" in c.devices for c in edge)
        assert all(c.p.get("values") == "edge" for c in edge)
        edge_ids = [c.id for c in edge]
        assert len(edge_ids) == len(set(edge_ids)) and not set(edge_ids) & {c.id for c in fam.FAMILY.cases}


def test_the_naive_max_pool3d_with_indices_matches_the_reference(rng):
    c = next(c for c in fam_pool3d.FAMILY.cases if c.name == "cpu_k3s1_idx")
    arrays = fam_pool3d.FAMILY.make_inputs(c, rng)
    outs = fam_pool3d.FAMILY.naive_forward(c, [to_jittor(arrays[0], c.dtype)])
    for o, e in zip(outs, fam_pool3d.FAMILY.expected(c, arrays)):
        ok, _, why = judge(to_numpy(o), str(o.dtype), e)
        assert ok, why


def _jittor_cuda_grad_loop_reads_outside(shape, k, s, p, ceil_mode):
    """jittor's CUDA max_pool3d gradient loop, walked index by index: it runs i over the input's extent in each
    spatial dim and reads the output and its gradient at i wherever the window from i overlaps the input."""
    out_of_range = False
    for n, kk, ss, pp in zip(shape[-3:], k, s, p):
        out = (n + 2 * pp - kk + (ss - 1 if ceil_mode else 0)) // ss + 1
        windows = [i for i in range(n) if max(0, i * ss - pp) < min(i * ss - pp + kk, n)]
        out_of_range |= any(i >= out for i in windows)
    return out_of_range


def test_jittors_cuda_pool_backward_is_skipped_exactly_where_it_reads_outside():
    geometries = [((1, 1) + c.shapes[0][-3:], fam_pool3d.case_params(c)) for c in fam_pool3d.FAMILY.all_cases()
                  if fam_pool3d.case_params(c)["dilation"] in (1, (1, 1, 1))]
    geometries += [((1, 1, n, n + 1, n + 2), {"kernel_size": k, "stride": s, "padding": p, "ceil_mode": cm})
                   for n in (5, 8, 9) for k in (1, 2, 3) for s in (1, 2, 3) for p in range(k // 2 + 1)
                   for cm in (False, True)]
    flagged = 0
    for shape, kp in geometries:
        k = fam_pool3d._triple(kp["kernel_size"])
        s = k if kp["stride"] is None else fam_pool3d._triple(kp["stride"])
        want = _jittor_cuda_grad_loop_reads_outside(shape, k, s, fam_pool3d._triple(kp["padding"]), kp["ceil_mode"])
        got = fam_pool3d.jittor_cuda_backward_reads_outside(shape, kp["kernel_size"], kp["stride"], kp["padding"],
                                                            kp["ceil_mode"])
        assert got == want, (shape, kp)
        flagged += got
    assert 0 < flagged < len(geometries)
    by_name = {c.id: c for c in fam_pool3d.FAMILY.all_cases()}
    k3s1, k2s2 = by_name["max_pool3d/bwd/k3s1_4x32x32x32x32"], by_name["max_pool3d/bwd/k2s2_8x32x32x64x64"]
    assert fam_pool3d.jittor_cuda_backward_reads_outside(k3s1.shapes[0], 3, 1, 0, False)
    assert not fam_pool3d.jittor_cuda_backward_reads_outside(k2s2.shapes[0], 2, 2, 0, False)


@pytest.mark.cuda
def test_jittors_cuda_pool_backward_reference_skips_where_it_reads_outside():
    by_name = {c.id: c for c in fam_pool3d.FAMILY.all_cases()}
    k3s1, k2s2 = by_name["max_pool3d/bwd/k3s1_4x32x32x32x32"], by_name["max_pool3d/bwd/k2s2_8x32x32x64x64"]
    jt.flags.use_cuda = 1
    try:
        with pytest.raises(ReferenceSkipped, match="reads outside"):
            fam_pool3d.FAMILY.jittor_forward(k3s1, [jt.zeros(k3s1.shapes[0])])
        assert fam_pool3d.FAMILY.jittor_forward(k2s2, [jt.zeros((1, 1, 4, 4, 4))])
    finally:
        jt.flags.use_cuda = 0


class _SlowFirstCall(harness.JittorImpl):
    """A jittor implementation whose calls sleep: the first ``first_ms``, later ones ``later_ms``; it compiles
    nothing (its first call stands for one that loads kernels from the cache and allocates)."""

    def __init__(self, first_ms, later_ms):
        self.delays, self.calls = [first_ms, later_ms], 0

    def prepare(self, k):
        return None

    def call(self, k, prepared):
        time.sleep(self.delays[min(self.calls, 1)] / 1e3)
        self.calls += 1
        return []


def test_a_first_call_is_never_the_measurement():
    """A first call that compiled nothing may still have loaded kernels, waited on jittor's cache lock or set up
    PyTorch's autograd, however long it took: the second call plans the rounds, or is the measurement of a slow
    implementation."""
    for first_ms in (30, 1050):
        loads = harness.Meter("naive", _SlowFirstCall(first_ms=first_ms, later_ms=1), timed=[0])
        loads.warm()
        assert loads.impl.calls == 2 and not loads.slow and loads.estimate_ms < harness.SLOW_MS, first_ms
    slow = harness.Meter("jittor", _SlowFirstCall(first_ms=1050, later_ms=harness.SLOW_MS + 5), timed=[0])
    slow.warm()  # slow on its second call too: that call is the measurement, no rounds
    assert slow.impl.calls == 2 and slow.slow and slow.wall == [slow.estimate_ms]
    assert harness.SLOW_MS < slow.estimate_ms < 1000


def test_a_timed_backward_runs_only_the_ops_gradient(rng):
    """InjectGrad hands each output its dy and is itself the root: jt.grad of it runs the graded op's gradient
    and nothing else (a sum of the root was a reduce over the output on every timed call)."""
    x = jt.array(rng.standard_normal((3, 5)).astype("float32"))
    a, b = x * 2.0, x * 3.0
    da, db = (rng.standard_normal((3, 5)).astype("float32") for _ in range(2))
    jt.sync([a, b])
    jt.profiler.start(0, 0)
    (gx,) = jt.grad(InjectGrad.apply(a, jt.array(da), b, jt.array(db)), [x])
    got = gx.numpy()
    jt.profiler.stop()
    terms = (2.0 * da.astype(np.float64), 3.0 * db.astype(np.float64))
    # two float32 roundings (3 * db, then the sum): within 2 ulps of the terms' magnitude
    assert np.all(np.abs(got - (terms[0] + terms[1])) <= 2.0 ** -22 * (np.abs(terms[0]) + np.abs(terms[1])))
    ran = [row[0] for row in jt.profiler.report()[1:]]
    assert ran and not any("reduce" in name for name in ran), ran
