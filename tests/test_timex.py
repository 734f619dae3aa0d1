"""timex (RWKV time-mix): references, dispatch table, values and gradients for every dtype on odd and tiny
shapes (CPU; GPU under -m cuda), forced multi-tile paths, deterministic gradients, errors, the case table, and
an nvcc compile of every kernel instantiation the dispatcher can render."""
import contextlib
import dataclasses
import itertools

import numpy as np
import pytest

import ops
from ops._jittor import jt

from ops import time_mix as X  # noqa: E402

from ops.scoring import fam_timex as F  # noqa: E402
from ops.scoring.harness import InjectGrad, to_jittor, to_numpy64  # noqa: E402
from ops.scoring.spec import ReferenceSkipped, random_array, round_to_bfloat16  # noqa: E402

DTYPES = ["float32", "float16", "bfloat16"]


def inputs(rng, B, C, T, dtype):
    return random_array((C, T), dtype, rng), random_array((B, C, T), dtype, rng)


def assert_close(got, want, dtype, terms, msg=""):
    rtol, atol = F.timex_tolerance(dtype, terms)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=str(msg))


def run_grads(w_np, k_np, g_np, dtype, eps=0.0):
    """(grad_w, grad_k) as float64 arrays, with the output gradient g injected as is."""
    w, k = to_jittor(w_np, dtype), to_jittor(k_np, dtype)
    out = ops.timex(w, k, eps)
    loss = InjectGrad.apply(out, to_jittor(g_np, dtype)).sum()
    gw, gk = jt.grad(loss, [w, k])
    return to_numpy64(gw), to_numpy64(gk)


def check_forward_then_grads(rng, B, C, T, dtype):
    """The forward at eps 0.01 checked against the reference on random inputs; returns the inputs, the output
    gradient and (grad_w, grad_k) for the caller to check."""
    w, k = inputs(rng, B, C, T, dtype)
    g = random_array((B, C, T), dtype, rng)
    out = ops.timex(to_jittor(w, dtype), to_jittor(k, dtype), 0.01)
    assert_close(to_numpy64(out), F.reference_timex(w, k, 0.01), dtype, T)
    return w, k, g, run_grads(w, k, g, dtype)


# ---- references -------------------------------------------------------------------------------------------

def _direct(w, k, g, eps):
    """The definition's loops, vectorized over (b, c): the definition the FFT references must match."""
    B, C, T = k.shape
    out = np.full((B, C, T), eps)
    gk = np.zeros((B, C, T))
    gw = np.zeros((C, T))
    for t in range(T):
        for u in range(t + 1):
            wv = w[:, T - 1 - (t - u)]
            out[:, :, t] += wv * k[:, :, u]
            gk[:, :, u] += wv * g[:, :, t]
            gw[:, T - 1 - (t - u)] += (g[:, :, t] * k[:, :, u]).sum(0)
    return out, gw, gk


@pytest.mark.parametrize("B, C, T", [(1, 1, 1), (2, 3, 5), (3, 2, 17)])
def test_fft_references_match_the_definition(rng, B, C, T):
    w, k, g = rng.standard_normal((C, T)), rng.standard_normal((B, C, T)), rng.standard_normal((B, C, T))
    out, gw, gk = _direct(w, k, g, 0.25)
    np.testing.assert_allclose(F.reference_timex(w, k, 0.25), out, rtol=1e-12, atol=1e-12)
    rgw, rgk = F.reference_timex_grads(w, k, g)
    np.testing.assert_allclose(rgw, gw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rgk, gk, rtol=1e-12, atol=1e-12)


# ---- dispatch ---------------------------------------------------------------------------------------------

# (k shape, kernel, variant, tm, lanes_b, tile, ntiles, splits, threads)
SELECT_TABLE = [
    ((1, 1, 1), "forward", "fwd_single", 1, 1, 256, 1, 1, 32),
    ((2, 3, 130), "forward", "fwd_single", 2, 1, 256, 1, 1, 32),
    ((3, 4, 37), "forward", "fwd_single", 4, 1, 256, 1, 1, 32),
    ((8, 512, 1024), "forward", "fwd_single", 4, 2, 1024, 1, 1, 256),
    ((32, 768, 768), "forward", "fwd_single", 4, 4, 768, 1, 1, 384),
    ((16, 256, 777), "forward", "fwd_single", 4, 4, 832, 1, 1, 416),
    ((64, 256, 256), "forward", "fwd_single", 4, 4, 256, 1, 1, 128),
    ((4, 256, 4096), "forward", "fwd_tiled", 4, 1, 512, 8, 1, 64),
    ((2, 2, 1100), "forward", "fwd_tiled", 2, 1, 512, 3, 1, 64),
    ((1, 1, 1025), "forward", "fwd_tiled", 1, 1, 512, 3, 1, 64),
    ((16, 8, 8192), "forward", "fwd_tiled", 4, 4, 512, 16, 1, 256),
    ((1, 1, 1), "grad_w", "gw_single", 1, 1, 512, 1, 1, 32),
    ((3, 4, 37), "grad_w", "gw_single", 1, 2, 256, 1, 2, 32),
    ((64, 256, 256), "grad_w", "gw_single", 1, 8, 256, 1, 4, 128),
    ((8, 512, 512), "grad_w", "gw_single", 1, 8, 512, 1, 1, 256),
    ((32, 768, 768), "grad_w", "gw_tiled", 1, 8, 256, 3, 1, 128),
    ((8, 512, 1024), "grad_w", "gw_tiled", 1, 8, 256, 4, 1, 128),
    ((4, 256, 4096), "grad_w", "gw_tiled", 1, 4, 256, 16, 1, 64),
    ((1, 2, 600), "grad_w", "gw_tiled", 1, 1, 512, 2, 1, 32),
]


@pytest.mark.parametrize("shape, kernel, variant, tm, lanes, tile, ntiles, splits, threads", SELECT_TABLE)
def test_select_config_table(shape, kernel, variant, tm, lanes, tile, ntiles, splits, threads):
    cfg = X.select_config(shape, kernel)
    got = (cfg.variant, cfg.tm, cfg.lanes_b, cfg.tile, cfg.ntiles, cfg.splits, cfg.threads)
    assert got == (variant, tm, lanes, tile, ntiles, splits, threads)
    assert cfg.index_t == "int"


# fwd_mma (TC_MMA): (shape, dtype, tm = n-tiles of 8 rows, rows per block, ntiles, groups, smem bytes)
MMA_TABLE = [
    ((32, 768, 768), "float32", 4, 32, 6, 1, 4 * (32 * 132 + 7 * 128)),
    ((17, 3, 1024), "float32", 1, 8, 8, 3, 4 * (8 * 132 + 9 * 128)),  # 24 padded rows, not 32
    ((64, 256, 256), "float32", 4, 32, 2, 2, 4 * (32 * 132 + 3 * 128)),
    ((8, 512, 1024), "float16", 1, 8, 8, 1, 4 * (8 * 132 + 9 * 128)),
    ((16, 256, 777), "bfloat16", 2, 16, 7, 1, 4 * (16 * 132 + 8 * 128)),
    ((1, 1, 1), "bfloat16", 1, 8, 1, 1, 4 * (8 * 132 + 2 * 128)),
]


@pytest.mark.parametrize("shape, dtype, tm, rows, ntiles, groups, smem", MMA_TABLE)
def test_select_config_tensor_core_table(shape, dtype, tm, rows, ntiles, groups, smem):
    cfg = X.select_config(shape, tensor_cores=X.TC_MMA, dtype=dtype)
    got = (cfg.variant, cfg.tm, cfg.lanes_b, cfg.tile, cfg.ntiles, cfg.groups, cfg.threads, cfg.smem_bytes)
    assert got == ("fwd_mma", tm, rows, X.MMA_TILE, ntiles, groups, X.MMA_THREADS, smem)
    assert smem <= 227 * 1024


# TC_AUTO, the default on sm_80+: (B, T, dtype, variant) from the 2026-11-23 measurements (ops/time_mix.py);
# (4, 4096, float32): the batch fills half of the 8 padded rows, below float32's 0.8
AUTO_TABLE = [
    (32, 768, "float32", "fwd_mma3"), (8, 1024, "float32", "fwd_mma3"), (16, 777, "float32", "fwd_mma3"),
    (64, 256, "float32", "fwd_mma3"), (4, 4096, "float32", "fwd_tiled"), (32, 1025, "float32", "fwd_mma3"),
    (32, 768, "bfloat16", "fwd_mma"), (8, 1024, "float16", "fwd_mma"), (32, 1025, "float16", "fwd_mma3"),
    (4, 4096, "bfloat16", "fwd_mma3"),
    # the batch must fill MMA_MIN_FILL of the padded rows: float32 0.8, 16-bit 0.5
    (6, 768, "float32", "fwd_single"), (7, 768, "float32", "fwd_mma3"), (12, 768, "float32", "fwd_single"),
    (17, 768, "float32", "fwd_single"), (20, 768, "float32", "fwd_mma3"), (3, 768, "bfloat16", "fwd_single"),
    (4, 768, "bfloat16", "fwd_mma"), (1, 1, "float16", "fwd_single"), (3, 2000, "float16", "fwd_tiled"),
]


@pytest.mark.parametrize("B, T, dtype, variant", AUTO_TABLE)
def test_auto_tensor_cores_where_they_were_measured_accurate_and_faster(B, T, dtype, variant):
    assert X.select_config((B, 4, T), tensor_cores=X.TC_AUTO, dtype=dtype).variant == variant
    assert X.select_config((B, 4, T), "grad_w", tensor_cores=X.TC_AUTO).variant.startswith("gw_")


@pytest.mark.parametrize("B, T, dtype", [(32, 768, "float32"), (20, 640, "float32"), (12, 2000, "bfloat16")])
def test_auto_runs_the_kernel_the_switch_runs(B, T, dtype):
    """Where TC_AUTO picks fwd_mma3 it renders the very source that OPS_TIMEX_MMA=3 runs (the GPU tests of the
    switch cover the default's kernel)."""
    auto = X.select_config((B, 16, T), tensor_cores=X.TC_AUTO, dtype=dtype)
    assert auto.variant == "fwd_mma3"
    assert auto == X.select_config((B, 16, T), tensor_cores=X.TC_MMA3, dtype=dtype)
    assert X.render_source(auto, "cuda") == X.render_source(
        X.select_config((B, 16, T), tensor_cores=X.TC_MMA3, dtype=dtype), "cuda")


def test_tensor_core_modes():
    assert X.MMA_MAX_T == 1024  # fwd_mma's float32 accumulation error past it (docs/design.md)
    for dtype in DTYPES:  # the A/B switches: a kernel wherever it can run, whatever the batch fill
        assert X.select_config((1, 2, 1024), tensor_cores=X.TC_MMA, dtype=dtype).variant == "fwd_mma"
        assert X.select_config((1, 2, 1025), tensor_cores=X.TC_MMA, dtype=dtype).variant == "fwd_tiled"
        assert X.select_config((1, 2, 9000), tensor_cores=X.TC_MMA3, dtype=dtype).variant == "fwd_mma3"
        assert X.select_config((32, 768, 768), tensor_cores=X.TC_OFF, dtype=dtype).variant == "fwd_single"
    # forced CUDA-core tiles (tests of fwd_tiled) keep the CUDA-core kernel
    assert X.select_config((4, 2, 300), tensor_cores=X.TC_AUTO, single_max_t=64, tile=64).variant == "fwd_tiled"
    assert X.select_config((32, 768, 768)).variant == "fwd_single"  # without a mode: CUDA cores


@pytest.mark.parametrize("shape, dtype, tm, rows", [((32, 768, 768), "float32", 4, 32), ((3, 2, 8192), "float32", 1, 8),
                                                    ((16, 256, 4096), "bfloat16", 2, 16), ((1, 1, 1), "float16", 1, 8)])
def test_select_config_mma3_any_length(shape, dtype, tm, rows):
    mode, variant = X.TC_MMA3, "fwd_mma3"
    cfg = X.select_config(shape, tensor_cores=mode, dtype=dtype)
    halves = 2 if dtype == "float32" else 1  # big and small TF32 halves of float32 operands
    smem = 4 * 2 * halves * (rows * 132 + 264)  # two stages; independent of T
    got = (cfg.variant, cfg.tm, cfg.lanes_b, cfg.ntiles, cfg.threads, cfg.smem_bytes)
    assert got == (variant, tm, rows, -(-shape[2] // 128), X.MMA_THREADS, smem)
    assert X.select_config(shape, "grad_w", tensor_cores=mode).variant.startswith("gw_")


def test_tensor_cores_need_cuda_and_can_be_switched(monkeypatch, switches):
    previous = jt.flags.use_cuda
    try:
        jt.flags.use_cuda = 0
        assert X.tensor_cores_available() == X.TC_OFF
        if ops.has_cuda():
            jt.flags.use_cuda = 1
            sm80 = min(jt.flags.cuda_archs) >= 80
            for value, mode in ((None, X.TC_AUTO), ("auto", X.TC_AUTO), ("1", X.TC_MMA), ("3", X.TC_MMA3),
                                ("0", X.TC_OFF)):
                if value is None:
                    switches.delenv(X.MMA_SWITCH, raising=False)
                else:
                    switches.setenv(X.MMA_SWITCH, value)
                assert X.tensor_cores_available() == (mode if sm80 else X.TC_OFF)
    finally:
        jt.flags.use_cuda = previous


def test_tensor_core_switch_rejects_unknown_values(monkeypatch, switches):
    switches.setenv(X.MMA_SWITCH, "yes")
    with pytest.raises(ValueError, match="OPS_TIMEX_MMA must be one of auto, 0, 1, 3, got .yes."):
        X.tensor_cores_available()


def test_every_variant_and_constant_is_picked_by_the_table():
    cfgs = [X.select_config(s, kern) for s, kern, *_ in SELECT_TABLE]
    cfgs += [X.select_config(s, tensor_cores=X.TC_MMA, dtype=d) for s, d, *_ in MMA_TABLE]
    cfgs.append(X.select_config((32, 768, 768), tensor_cores=X.TC_MMA3))
    assert {c.variant for c in cfgs} == set(X.VARIANTS)
    assert {c.tm for c in cfgs if c.kernel == "forward"} == {1, 2, 4}
    assert {c.tm for c in cfgs if c.variant == "fwd_mma"} == {1, 2, 4}
    assert {c.lanes_b for c in cfgs if c.variant in ("fwd_single", "fwd_tiled")} == {1, 2, 4}
    assert {c.lanes_b for c in cfgs if c.kernel == "grad_w"} == {1, 2, 4, 8}
    assert any(c.splits > 1 for c in cfgs) and any(c.ntiles > 1 for c in cfgs)


def test_int64_indexing_only_past_int32():
    assert X.select_config((1024, 2048, 1024)).index_t == "long long"  # 2^31 elements
    assert X.select_config((1023, 2048, 1024)).index_t == "int"
    assert X.select_config((2, 1024, 1 << 20), "grad_w").index_t == "long long"


@pytest.mark.parametrize("kernel", ["forward", "grad_w"])
def test_config_invariants(kernel):
    """What the kernels assume (timex.cuh's contract), over a sweep of shapes."""
    lengths = (1, 31, 257, 512, 513, 1024, 1025, 4097, 8192)
    for B, C, T in itertools.product((1, 2, 3, 5, 8, 9, 16, 33, 64), (1, 7, 768), lengths):
        cfg = X.select_config((B, C, T), kernel)
        per = 8 if kernel == "forward" else 16
        limit = X.FWD_MAX_THREADS if kernel == "forward" else X.GW_MAX_THREADS
        assert cfg.threads % 32 == 0 and 32 <= cfg.threads <= limit
        assert cfg.tile % 32 == 0 and cfg.tile * cfg.lanes_b == per * cfg.threads
        assert (cfg.ntiles - 1) * cfg.tile < T <= cfg.ntiles * cfg.tile
        assert cfg.smem_bytes <= 227 * 1024
        if kernel == "forward":
            assert cfg.lanes_b in (1, 2, 4) and cfg.tm in (1, 2, 4)
            rows = cfg.lanes_b * cfg.tm
            assert cfg.groups == -(-B // rows) and cfg.splits == 1
            assert cfg.smem_bytes == 4 * (rows * (cfg.tile + 4) + 2 * cfg.tile)
        else:
            ngroups = -(-B // cfg.lanes_b)
            assert cfg.lanes_b in (1, 2, 4, 8) and cfg.lanes_b <= B
            assert (cfg.splits - 1) * cfg.groups < ngroups <= cfg.splits * cfg.groups
            assert cfg.smem_bytes == 4 * cfg.lanes_b * (3 * cfg.tile + 8)
            assert 16 * cfg.threads <= cfg.smem_bytes // 4  # the lane-reduction buffer fits


@pytest.mark.parametrize("macro, value", [
    ("TIMEX_FWD_MAX_THREADS", X.FWD_MAX_THREADS), ("TIMEX_GW_MAX_THREADS", X.GW_MAX_THREADS),
    ("TIMEX_MMA_TILE", X.MMA_TILE), ("TIMEX_MMA_THREADS", X.MMA_THREADS)])
def test_python_launch_constants_match_the_kernels(macro, value):
    assert f"#define {macro} {value}" in ops._codegen.snippet("timex")


def test_cpu_plans_run_the_direct_sums_and_a_given_config_the_gpu_emulation():
    """On the CPU, ops.timex's forward and grad_k run timex_fwd_direct, grad_w timex_gw_direct (every shape, one
    source per dtype); launch_forward with a config runs that GPU kernel's emulation (the tests of the GPU's index
    math)."""
    fwd = X._plan((2, 3, 40), "float32", 0.5, True, False).forward_launch.kwargs
    assert fwd["cpu_src"] == X._DIRECT_SRC and fwd["data"] == {"e": 0.5, "r": 0}
    assert X._plan((1, 1, 1), "float32", 0.0, False, False).launch.kwargs["cpu_src"] == X._DIRECT_SRC
    assert X.direct_launch((2, 3, 40), "float32", 0.0, True).kwargs["data"] == {"e": 0.0, "r": 1}
    assert X.direct_grad_w_launch((2, 3, 40), "float32").kwargs["cpu_src"] == X._DIRECT_GW_SRC
    cfg = X.select_config((2, 3, 40))
    assert "timex_fwd_menu" in X.forward_launch(cfg, (2, 3, 40), "float32", 0.0, False, False).kwargs["cpu_src"]


def test_render_source_carries_only_code_changing_values():
    a = X.select_config((32, 768, 768))
    b = X.select_config((16, 7, 300))
    assert X.render_source(a, "cuda") == X.render_source(b, "cuda")  # same tm and index type
    assert "timex_fwd_launch<in0_type, 4, int>" in X.render_source(a, "cuda")
    assert "timex_fwd_host<in0_type, 4, int>" in X.render_source(a, "cpu")
    gw = X.select_config((32, 768, 768), "grad_w")
    assert "timex_gw_launch<in0_type, int>" in X.render_source(gw, "cuda")
    mma = X.select_config((32, 768, 768), tensor_cores=X.TC_MMA)
    assert "timex_fwd_mma_launch<in0_type, 4, int>" in X.render_source(mma, "cuda")
    with pytest.raises(ValueError, match="CUDA-only"):  # never selected off CUDA
        X.render_source(mma, "cpu")
    mma3 = X.select_config((32, 768, 768), tensor_cores=X.TC_MMA3)
    assert "timex_fwd_mma3_launch<in0_type, 4, int>" in X.render_source(mma3, "cuda")


# ---- values -----------------------------------------------------------------------------------------------

VALUE_CASES = [
    # B, C, T, dtype, eps: tm 1/2/4, lanes 1/2/4, odd T, tails in t and in batch, tiled T
    (1, 1, 1, "float32", 0.5),
    (3, 4, 37, "float32", 0.0),
    (2, 3, 130, "float32", -0.25),
    (16, 2, 96, "float32", 0.0),
    (9, 2, 777, "float32", 0.0),
    (2, 2, 1100, "float32", 0.0),
    (5, 3, 64, "float16", 0.125),
    (1, 3, 50, "float16", 0.0),
    (4, 2, 200, "bfloat16", 0.0),
    (18, 1, 33, "bfloat16", 1.0),
]


@pytest.mark.parametrize("B, C, T, dtype, eps", VALUE_CASES)
def test_forward_values(device, rng, B, C, T, dtype, eps):
    w, k = inputs(rng, B, C, T, dtype)
    out = ops.timex(to_jittor(w, dtype), to_jittor(k, dtype), eps)
    assert str(out.dtype) == dtype and tuple(out.shape) == (B, C, T)
    assert_close(to_numpy64(out), F.reference_timex(w, k, eps), dtype, T)


# Small tiles force many t-tiles (squares + triangle + a partial last tile) on shapes the CPU runs fast.
FORCED = [((16, 2, 300), 64), ((3, 2, 301), 256), ((9, 3, 130), 64), ((1, 1, 257), 256)]


def forced_tiles(shape, kernel, tile, variant, rng):
    """A ``kernel`` config of ``variant`` cut into several t-tiles of ``tile``, and float32 w, k and gradient g."""
    cfg = X.select_config(shape, kernel, single_max_t=0, tile=tile)
    assert cfg.variant == variant and cfg.ntiles > 1
    w, k = inputs(rng, *shape, "float32")
    return cfg, w, k, random_array(shape, "float32", rng)


@pytest.mark.parametrize("shape, tile", FORCED)
def test_forward_and_grad_k_with_forced_tiles(device, rng, shape, tile):
    T = shape[2]
    cfg, w, k, g = forced_tiles(shape, "forward", tile, "fwd_tiled", rng)
    out = X.launch_forward(to_jittor(w, "float32"), to_jittor(k, "float32"), 0.5, cfg=cfg)
    assert_close(to_numpy64(out), F.reference_timex(w, k, 0.5), "float32", T)
    gk = X.launch_forward(to_jittor(w, "float32"), to_jittor(g, "float32"), 0.0, reverse=True, cfg=cfg)
    assert_close(to_numpy64(gk), F.reference_timex_grads(w, k, g)[1], "float32", T)


@pytest.mark.parametrize("shape, tile", [((9, 2, 300), 64), ((2, 3, 301), 256), ((16, 1, 520), 64)])
def test_grad_w_with_forced_tiles(device, rng, shape, tile):
    B, _, T = shape
    cfg, w, k, g = forced_tiles(shape, "grad_w", tile, "gw_tiled", rng)
    gw = X.launch_grad_w(to_jittor(k, "float32"), to_jittor(g, "float32"), cfg=cfg)
    assert_close(to_numpy64(gw), F.reference_timex_grads(w, k, g)[0], "float32", B * T)


def test_module_matches_function(rng):
    w, k = inputs(rng, 2, 3, 20, "float32")
    m = ops.TimeX(eps=0.75)
    assert m.eps == 0.75
    got = to_numpy64(m(to_jittor(w, "float32"), to_jittor(k, "float32")))
    assert_close(got, F.reference_timex(w, k, 0.75), "float32", 20)


# ---- gradients --------------------------------------------------------------------------------------------

GRAD_CASES = [
    (1, 1, 1, "float32"),
    (3, 4, 37, "float32"),
    (16, 2, 96, "float32"),
    (9, 2, 700, "float32"),   # gw_tiled with 2 batch splits
    (2, 2, 1100, "float32"),  # fwd_tiled (grad_k) and gw_tiled
    (5, 3, 64, "float16"),
    (4, 2, 200, "bfloat16"),
]


@pytest.mark.parametrize("B, C, T, dtype", GRAD_CASES)
def test_gradients(device, rng, B, C, T, dtype):
    w, k = inputs(rng, B, C, T, dtype)
    g = random_array((B, C, T), dtype, rng)
    gw, gk = run_grads(w, k, g, dtype, eps=0.5)
    rgw, rgk = F.reference_timex_grads(w, k, g)
    assert gw.shape == (C, T) and gk.shape == (B, C, T)
    assert_close(gw, rgw, dtype, B * T, "grad_w")
    assert_close(gk, rgk, dtype, T, "grad_k")


@pytest.mark.parametrize("B, C, T", [(9, 2, 700), (16, 3, 96)])
def test_gradients_are_deterministic(device, rng, B, C, T):
    w, k = inputs(rng, B, C, T, "float32")
    g = random_array((B, C, T), "float32", rng)
    assert X.select_config((B, C, T), "grad_w").splits > 1  # the split reduction is in the path
    first = run_grads(w, k, g, "float32")
    second = run_grads(w, k, g, "float32")
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


# ---- non-finite inputs: causality -------------------------------------------------------------------------

def causal_reference(w, k, g, eps=0.0):
    """(out, grad_w, grad_k) in float64, each sum over exactly its own terms, lag by lag (no term outside a
    sum is ever formed): an Inf or NaN reaches the outputs whose sums hold it, as IEEE says (0 * Inf inside a
    sum is NaN), and no other."""
    w, k, g = (np.asarray(a, dtype=np.float64) for a in (w, k, g))
    B, C, T = k.shape
    wr = w[:, ::-1]  # wr[c, s] = w[c, T-1-s]
    out, grad_k, grad_wr = np.full((B, C, T), eps), np.zeros((B, C, T)), np.zeros((C, T))
    with np.errstate(invalid="ignore", over="ignore"):
        for s in range(T):  # lag s: out[t] += wr[s] k[t-s]; grad_k[u] += wr[s] g[u+s]; grad_wr[s] = sum g[t] k[t-s]
            out[:, :, s:] += wr[None, :, s, None] * k[:, :, :T - s]
            grad_k[:, :, :T - s] += wr[None, :, s, None] * g[:, :, s:]
            grad_wr[:, s] = (g[:, :, s:] * k[:, :, :T - s]).sum(axis=(0, 2))
    return out, grad_wr[:, ::-1], grad_k


def test_causal_reference_matches_the_definition(rng):
    w, k, g = rng.standard_normal((2, 9)), rng.standard_normal((3, 2, 9)), rng.standard_normal((3, 2, 9))
    out, gw, gk = causal_reference(w, k, g, 0.5)
    want = _direct(w, k, g, 0.5)
    for got, ref in zip((out, gw, gk), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    k[1, 0, 4] = np.nan  # reaches out[1, 0, 4:] only
    out = causal_reference(w, k, g)[0]
    assert np.isnan(out[1, 0, 4:]).all() and np.isfinite(out[1, 0, :4]).all() and np.isfinite(out[0]).all()


def poison(a, rng, count, rows, lo, hi):
    """A copy of ``a`` (..., T) with ``count`` NaN, +Inf and -Inf values at random places: rows of the
    flattened leading dims from ``rows``, steps in [lo, hi)."""
    a = np.array(a)
    flat = a.reshape(-1, a.shape[-1])
    for _ in range(count):
        flat[rng.choice(rows), rng.integers(lo, hi)] = rng.choice([np.nan, np.inf, -np.inf])
    return a


def nonfinite_inputs(rng, B, C, T, dtype, where):
    """w, k, g of ``dtype`` with Inf/NaN values.

    "k,g": in k at steps >= T/4 and in g at steps < T - T/4, row (0, 0) left finite: outputs before the first
    poisoned step, grad_w's lags >= T - T/4 and the clean row stay finite, and blocks mix clean and poisoned
    rows. "w": in w at lags >= T/2 (outputs before them stay finite).
    """
    w, k = inputs(rng, B, C, T, dtype)
    g = random_array((B, C, T), dtype, rng)
    if where == "w":
        for c in range(C):
            lag = rng.integers(T // 2, T)
            w[c, T - 1 - lag] = rng.choice([np.nan, np.inf, -np.inf])
        return w, k, g
    rows = np.arange(1, B * C) if B * C > 1 else np.arange(1)
    count = max(2, B * C * T // 40)
    q = max(1, T // 4)
    return w, poison(k, rng, count, rows, q, T), poison(g, rng, count, rows, 0, T - q)


def assert_matches_causal(got, want, dtype, terms, what, mixed=True):
    """NaN exactly where the reference has NaN, the same infinities, finite values close elsewhere; ``mixed``:
    the reference must hold both finite and non-finite values (the case tests something)."""
    assert got.shape == want.shape, what
    finite = np.isfinite(want)
    assert finite.any() and (not mixed or not finite.all()), f"{what}: the case must mix finite and non-finite"
    bad = np.isnan(got) != np.isnan(want)
    assert not bad.any(), f"{what}: NaN where the reference has {want[bad][:5]} (at {np.argwhere(bad)[:5].tolist()})"
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf]), f"{what}: infinities differ"
    assert np.isfinite(got[finite]).all(), f"{what}: non-finite where the reference is finite"
    assert_close(got[finite], want[finite], dtype, terms, what)


def check_nonfinite(w, k, g, dtype, eps=0.25):
    """Forward, grad_w and grad_k of ops.timex against causal_reference (grad_w does not see w: it may be all
    finite)."""
    B, C, T = k.shape
    out = ops.timex(to_jittor(w, dtype), to_jittor(k, dtype), eps)
    gw, gk = run_grads(w, k, g, dtype, eps)
    want_out, want_gw, want_gk = causal_reference(w, k, g, eps)
    assert_matches_causal(to_numpy64(out), want_out, dtype, T, "forward")
    assert_matches_causal(gk, want_gk, dtype, T, "grad_k")
    assert_matches_causal(gw, want_gw, dtype, B * T, "grad_w", mixed=np.isfinite(w).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_reaches_no_earlier_output(dtype):
    """A NaN at step 2 must leave outputs 0 and 1 alone."""
    jt.flags.use_cuda = 0
    w = to_jittor(np.ones((1, 4), np.float32), dtype)
    k = to_jittor(np.array([[[1.0, 2.0, np.nan, 3.0]]], np.float32), dtype)
    got = to_numpy64(ops.timex(w, k))[0, 0]
    assert got[:2].tolist() == [1.0, 3.0] and np.isnan(got[2:]).all()


# T = 4 (one group: the diagonal step only), 37 (the triangle's steps and a ragged tail), 1100 (fwd_tiled and
# gw_tiled); B gives tm 1, 4 and 2 and one or two batch splits of grad_w.
@pytest.mark.parametrize("where", ["k,g", "w"])
@pytest.mark.parametrize("B, C, T", [(1, 2, 4), (3, 2, 37), (2, 1, 1100)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nonfinite_values_stay_causal_on_cpu(rng, dtype, B, C, T, where):
    jt.flags.use_cuda = 0
    check_nonfinite(*nonfinite_inputs(rng, B, C, T, dtype, where), dtype)


def check_nonfinite_forced_tiles(rng, shape, tile, dtype):
    """fwd_tiled (forward and grad_k) and gw_tiled with small tiles: triangles inside every t-tile."""
    B, C, T = shape
    fwd = X.select_config(shape, "forward", single_max_t=0, tile=tile)
    gwc = X.select_config(shape, "grad_w", single_max_t=0, tile=tile)
    assert (fwd.variant, gwc.variant) == ("fwd_tiled", "gw_tiled") and fwd.ntiles > 2 and gwc.ntiles > 2
    w, k, g = nonfinite_inputs(rng, B, C, T, dtype, "k,g")
    want_out, want_gw, want_gk = causal_reference(w, k, g)
    wv, kv, gv = (to_jittor(a, dtype) for a in (w, k, g))
    assert_matches_causal(to_numpy64(X.launch_forward(wv, kv, 0.0, cfg=fwd)), want_out, dtype, T, "forward")
    assert_matches_causal(to_numpy64(X.launch_forward(wv, gv, 0.0, reverse=True, cfg=fwd)), want_gk, dtype, T,
                          "grad_k")
    assert_matches_causal(to_numpy64(X.launch_grad_w(kv, gv, cfg=gwc)), want_gw, dtype, B * T, "grad_w")


def test_nonfinite_values_stay_causal_with_forced_tiles_on_cpu(rng):
    jt.flags.use_cuda = 0
    check_nonfinite_forced_tiles(rng, (16, 1, 300), 64, "float32")


# On the GPU, every kernel: the CUDA cores (OPS_TIMEX_MMA=0: fwd_single, fwd_tiled; grad_w: gw_single,
# gw_tiled) and the tensor cores (1: fwd_mma, 3: fwd_mma3; n-tiles 1, 2 and 4; float32 through
# 3xTF32), whose diagonal chunks with an Inf or NaN run on the CUDA cores.
NONFINITE_GPU_CASES = [("0", 3, 2, 37, "fwd_single"), ("0", 2, 2, 1100, "fwd_tiled"), ("0", 9, 1, 600, "fwd_single"),
                       ("0", 1, 2, 4, "fwd_single"),
                       ("1", 8, 2, 300, "fwd_mma"), ("1", 16, 1, 37, "fwd_mma"), ("1", 32, 1, 260, "fwd_mma"),
                       ("3", 20, 2, 300, "fwd_mma3"), ("3", 16, 1, 1100, "fwd_mma3"), ("3", 32, 1, 130, "fwd_mma3"),
                       ("3", 3, 2, 4, "fwd_mma3")]


@contextlib.contextmanager
def on_gpu_with_mma_switch(switches, switch):
    """Run the body on the GPU with OPS_TIMEX_MMA = ``switch`` (skipped where a tensor-core kernel cannot run)."""
    if switch != "0" and min(jt.flags.cuda_archs) < 80:
        pytest.skip("the tensor-core kernels need sm_80+")
    switches.setenv(X.MMA_SWITCH, switch)
    previous = jt.flags.use_cuda
    jt.flags.use_cuda = 1
    try:
        yield
    finally:
        jt.flags.use_cuda = previous


@pytest.mark.cuda
@pytest.mark.parametrize("where", ["k,g", "w"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("switch, B, C, T, variant", NONFINITE_GPU_CASES)
def test_gpu_nonfinite_values_stay_causal(rng, switches, switch, B, C, T, variant, dtype, where):
    with on_gpu_with_mma_switch(switches, switch):
        assert X.select_config((B, C, T), tensor_cores=X.tensor_cores_available(), dtype=dtype).variant == variant
        check_nonfinite(*nonfinite_inputs(rng, B, C, T, dtype, where), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_nonfinite_values_stay_causal_with_forced_tiles(rng, dtype):
    previous = jt.flags.use_cuda
    jt.flags.use_cuda = 1
    try:
        check_nonfinite_forced_tiles(rng, (16, 1, 300), 64, dtype)
    finally:
        jt.flags.use_cuda = previous


# ---- bfloat16 rounding ------------------------------------------------------------------------------------

def test_bfloat16_rounds_to_nearest_even_on_the_issue_case():
    jt.flags.use_cuda = 0
    w = to_jittor(np.ones((1, 2), np.float32), "bfloat16")
    k = to_jittor(np.array([[[1.0, 0.005859375]]], np.float32), "bfloat16")
    assert to_numpy64(ops.timex(w, k))[0, 0].tolist() == [1.0, 1.0078125]  # 1.005859375 rounds up


def test_bfloat16_results_are_rounded_to_nearest_even(device, rng):
    """Inputs on a 2^-6 grid make every float32 sum exact, so each result must be exactly that sum rounded to
    bfloat16 (ties to even), in the forward and both gradients."""
    B, C, T = 3, 2, 40
    w, k, g = (rng.integers(-64, 65, size=s) / 64.0 for s in ((C, T), (B, C, T), (B, C, T)))
    out = to_numpy64(ops.timex(to_jittor(w, "bfloat16"), to_jittor(k, "bfloat16")))
    gw, gk = run_grads(w, k, g, "bfloat16")
    exact = causal_reference(w, k, g)
    for what, got, want in zip(("forward", "grad_w", "grad_k"), (out, gw, gk), exact):
        want32 = want.astype(np.float32)
        assert np.array_equal(want32, want), "the grid keeps float32 sums exact"
        rounded = round_to_bfloat16(want32)
        truncated = (want32.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        assert (rounded != truncated).any(), "the case must tell rounding from truncation"
        assert np.array_equal(got, rounded.astype(np.float64)), what


def test_bfloat16_gradients_of_a_float32_output_gradient_are_rounded(device):
    """A float32 output gradient (a custom backward may pass one) is cast to bfloat16 rounded to nearest even
    before the gradients (jittor's CPU cast would truncate 1.005859375 to 1.0)."""
    w = to_jittor(np.ones((1, 2)), "bfloat16")
    k = to_jittor(np.ones((1, 1, 2)), "bfloat16")
    g = jt.array(np.array([[[1.005859375, 0.0]]], np.float32))
    gw, gk = jt.grad(InjectGrad.apply(ops.timex(w, k), g).sum(), [w, k])
    assert to_numpy64(gk).tolist() == [[[1.0078125, 0.0]]] and to_numpy64(gw).tolist() == [[0.0, 1.0078125]]


# ---- errors -----------------------------------------------------------------------------------------------

def test_errors_name_the_argument():
    w = jt.ones((3, 8))
    k = jt.ones((2, 3, 8))
    with pytest.raises(TypeError, match="w must be a jittor Var"):
        ops.timex(np.ones((3, 8), np.float32), k)
    with pytest.raises(TypeError, match="k must be a jittor Var"):
        ops.timex(w, [1.0])
    with pytest.raises(ValueError, match=r"w must have shape \(C, T\)"):
        ops.timex(jt.ones((3, 8, 1)), k)
    with pytest.raises(ValueError, match=r"k must have shape \(B, C, T\)"):
        ops.timex(w, jt.ones((3, 8)))
    with pytest.raises(ValueError, match=r"w must have shape \(C, T\) = k.shape\[1:\]"):
        ops.timex(jt.ones((3, 7)), k)
    with pytest.raises(ValueError, match=r"w must have shape \(C, T\) = k.shape\[1:\]"):
        ops.timex(jt.ones((4, 8)), k)
    with pytest.raises(ValueError, match=r"w must have shape \(C, T\) = k.shape\[1:\] = \(0, 8\)"):
        ops.timex(w, jt.ones((2, 0, 8)))
    with pytest.raises(TypeError, match="k must be float32, float16 or bfloat16"):
        ops.timex(w, jt.ones((2, 3, 8), dtype="int32"))
    with pytest.raises(TypeError, match="w must be float32, float16 or bfloat16"):
        ops.timex(jt.ones((3, 8), dtype="float64"), k)
    with pytest.raises(TypeError, match="w and k must have the same dtype"):
        ops.timex(w.float16(), k)
    with pytest.raises(TypeError, match="eps must be a real number"):
        ops.timex(w, k, eps="0.1")
    with pytest.raises(TypeError, match="eps must be a real number"):
        ops.timex(w, k, eps=True)
    with pytest.raises(ValueError, match="eps must be finite"):
        ops.timex(w, k, eps=float("nan"))
    with pytest.raises(TypeError, match="eps must be a real number"):
        ops.TimeX(eps=None)
    with pytest.raises(ValueError, match="kernel must be"):
        X.select_config((2, 3, 8), "backward")
    with pytest.raises(ValueError, match="k must have shape"):
        X.select_config((2, 3), "forward")
    with pytest.raises(ValueError, match="tile 2048 needs 1024 threads"):
        X.select_config((16, 2, 4096), "forward", tile=2048)
    with pytest.raises(ValueError, match="k: T = .* too long"):
        X.select_config((1, 1, 512 * 65535 + 1), "forward")


# ---- the case table ---------------------------------------------------------------------------------------

def test_case_table_shape():
    cases = F.FAMILY.cases
    assert {c.family for c in cases} == {"timex"}
    assert all(c.grad_of == (0, 1) for c in cases)
    gpu = {(c.name, c.direction) for c in cases if "cuda" in c.devices}
    for name in ("B32_C768_T768", "B8_C512_T1024", "B64_C256_T256", "B1_C1_T1", "B16_C256_T777",
                 "B4_C256_T4096", "B32_C768_T768_bf16"):
        assert (name, "fwd") in gpu and (name, "bwd") in gpu
    assert any("cpu" in c.devices and c.direction == "bwd" for c in cases)
    c = next(c for c in cases if c.name == "B32_C768_T768" and c.direction == "fwd")
    assert F.FAMILY.flops(c) == 32 * 768 * 768 * 769
    assert F.FAMILY.bytes_moved(c) == (768 * 768 + 2 * 32 * 768 * 768) * 4
    assert F.FAMILY.variant(c, ops) == "fwd_single/tm4"
    bwd = next(c for c in cases if c.name == "B32_C768_T768" and c.direction == "bwd")
    assert F.FAMILY.variant(bwd, ops) == "fwd_single/tm4+gw_tiled"
    assert F.FAMILY.variant(bwd, object()) == "-"


def test_every_cpu_case_matches_its_reference():
    jt.flags.use_cuda = 0
    rng = np.random.default_rng(0)
    for c in F.FAMILY.cases:
        if "cpu" not in c.devices or c.direction != "fwd":
            continue
        arrays = F.FAMILY.make_inputs(c, rng)
        xs = [to_jittor(a, c.dtype) for a in arrays]
        got = to_numpy64(F.FAMILY.forward(c, ops, xs)[0])
        rtol, atol = F.FAMILY.tolerance(c)
        np.testing.assert_allclose(got, F.FAMILY.reference_forward(c, arrays)[0], rtol=rtol, atol=atol,
                                   err_msg=c.id)


def test_naive_and_builtin_references_agree_on_a_small_case():
    c = next(c for c in F.FAMILY.cases if c.name == "cpu_B3_C4_T37" and c.direction == "fwd")
    arrays = F.FAMILY.make_inputs(c, np.random.default_rng(1))
    xs = [to_jittor(a, c.dtype) for a in arrays]
    want = F.FAMILY.reference_forward(c, arrays)[0]
    np.testing.assert_allclose(to_numpy64(F.FAMILY.naive_forward(c, xs)[0]), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy64(F.FAMILY.jittor_forward(c, xs)[0]), want, rtol=1e-5, atol=1e-5)


def test_builtin_reference_is_skipped_past_its_length_limit():
    long = next(c for c in F.FAMILY.cases if c.name == "B4_C256_T4096" and c.direction == "fwd")
    assert long.shapes[1][2] > F.MAX_T_JITTOR_CONV
    with pytest.raises(ReferenceSkipped, match="T = 1024"):
        F.FAMILY.jittor_forward(long, [None, jt.zeros(long.shapes[1])])


# ---- GPU-sized dispatch paths (run with -m cuda) -----------------------------------------------------------

GPU_CASES = [  # (B, C, T, dtype, the default forward on sm_80+ GPUs; grad_k takes the same), then grad_w
    (32, 64, 768, "float32", "fwd_mma3"),    # tm4 (B32 T768 with fewer channels), gw_tiled
    (8, 64, 1024, "float32", "fwd_mma3"),    # tm1, gw_tiled
    (64, 32, 256, "float32", "fwd_mma3"),    # 2 batch groups; gw_single with 4 batch splits
    (20, 16, 640, "float32", "fwd_mma3"),    # 3 groups of 8 rows, the last one partly padding
    (4, 16, 4096, "float32", "fwd_tiled"),   # half-filled rows: CUDA cores; gw_tiled with 16 tiles
    (6, 32, 1024, "float32", "fwd_single"),  # the batch fills 6 of 8 mma rows: CUDA cores
    (32, 64, 768, "bfloat16", "fwd_mma"),    # tm4, one exact mma per product
    (8, 64, 1024, "float16", "fwd_mma"),     # tm1
    (12, 16, 2000, "bfloat16", "fwd_mma3"),  # 16-bit past MMA_MAX_T, tm2
    (3, 8, 8192, "float32", "fwd_tiled"),    # T = 8192, odd B
]


@pytest.mark.cuda
@pytest.mark.parametrize("B, C, T, dtype, variant", GPU_CASES)
def test_gpu_sized_values_and_gradients(rng, monkeypatch, B, C, T, dtype, variant, switches):
    switches.delenv(X.MMA_SWITCH, raising=False)
    previous = jt.flags.use_cuda
    jt.flags.use_cuda = 1
    try:
        if min(jt.flags.cuda_archs) < 80:
            variant = "fwd_single" if T <= X.FWD_SINGLE_MAX_T else "fwd_tiled"
        cfg = X.select_config((B, C, T), tensor_cores=X.tensor_cores_available(), dtype=dtype)
        assert cfg.variant == variant  # the default forward (and grad_k) on this GPU
        w, k, g, (gw, gk) = check_forward_then_grads(rng, B, C, T, dtype)
        rgw, rgk = F.reference_timex_grads(w, k, g)
        assert_close(gw, rgw, dtype, B * T, "grad_w")
        assert_close(gk, rgk, dtype, T, "grad_k")
        again = run_grads(w, k, g, dtype)
        assert np.array_equal(gw, again[0]) and np.array_equal(gk, again[1])
    finally:
        jt.flags.use_cuda = previous


# The forward kernels the default does not pick on an sm_80+ GPU, through the switch: the CUDA-core kernels
# (the tensor cores replace them there; "0": 16 rows in the largest single tile, 74 KB of shared memory),
# fwd_mma's float32 3xTF32 ("1") and fwd_mma3 ("3") on 16-bit inputs up to
# MMA_MAX_T and on batches that fill few of its padded rows.
SWITCHED_CASES = [("0", 32, 16, 768, "float32"), ("0", 3, 8, 1100, "float32"), ("0", 8, 16, 1024, "bfloat16"),
                  ("0", 16, 32, 1024, "float32"), ("1", 24, 16, 768, "float32"),
                  ("3", 3, 8, 8192, "float32"),
                  ("3", 32, 16, 768, "float32"), ("3", 4, 16, 4096, "float32"), ("3", 16, 16, 1100, "bfloat16"),
                  ("3", 8, 16, 777, "float16"), ("3", 20, 8, 300, "float32")]


@pytest.mark.cuda
@pytest.mark.parametrize("switch, B, C, T, dtype", SWITCHED_CASES)
def test_gpu_switched_forward_and_grad_k(rng, monkeypatch, switch, B, C, T, dtype, switches):
    with on_gpu_with_mma_switch(switches, switch):
        variant = X.select_config((B, C, T), tensor_cores=X.tensor_cores_available(), dtype=dtype).variant
        assert variant == {"0": "fwd_single" if T <= X.FWD_SINGLE_MAX_T else "fwd_tiled", "1": "fwd_mma",
                           "3": "fwd_mma3"}[switch]
        w, k, g, (_, gk) = check_forward_then_grads(rng, B, C, T, dtype)
        assert_close(gk, F.reference_timex_grads(w, k, g)[1], dtype, T, "grad_k")
        assert np.array_equal(gk, run_grads(w, k, g, dtype)[1])


# ---- the tensor-core kernels' index math, emulated lane by lane (the CPU cannot run mma.sync) ---------------

def _mma_operands(version, wr, kk, ti, ui, BN, B, T):
    """What a block stages for chunk ui of t-tile ti: k rows (BN x 128) and a lookup lag -> w (as the kernel
    indexes its w buffer: fwd_mma the whole causal window, fwd_mma3 the chunk's 256 lags)."""
    ks = np.zeros((BN, 128))
    for r in range(min(BN, B)):
        n = min(128, T - ui * 128)
        ks[r, :n] = kk[r, ui * 128:ui * 128 + n]
    lo = -128 if version == 1 else (ti - ui) * 128 - 128
    size = (ti + 2) * 128 if version == 1 else 256
    lags = np.arange(lo, lo + size)
    buf = np.where((lags >= 0) & (lags < T), wr[np.clip(lags, 0, T - 1)], 0.0)
    return ks, buf, lo


def emulate_mma_block(version, w_row, k_rows, ti, NT):
    """out[b][t] of one block (channel, batch group, t-tile ti) of timex_fwd_mma{,3}_kernel: the kernel's
    fragment indices, mma.sync m16n8k8 as a 16x8x8 matrix product, float64."""
    T = w_row.shape[0]
    B, BN = k_rows.shape[0], 8 * NT
    wr = w_row[::-1]  # wr[lag] = w[T-1-lag]
    acc = np.zeros((4, 2, NT, 32, 4))
    for ui in range(ti + 1):
        ks, buf, lo = _mma_operands(version, wr, k_rows, ti, ui, BN, B, T)
        for q in range(4):
            for s in range(4 * q + 4 if ui == ti else 16):
                for m in range(2):
                    A = np.zeros((16, 8))
                    Bm = np.zeros((NT, 8, 8))
                    for lane in range(32):
                        g, tig = lane >> 2, lane & 3
                        if version == 1:  # kernel: base = t0 - u0 + 32q + BT + g - tig, then + 16m - 8s
                            a = ti * 128 - ui * 128 + 32 * q + 128 + g - tig + 16 * m - 8 * s
                            words = [a, a + 8, a - 4, a + 4]
                        else:  # the ladder of the group s0 = s - e: G[i] = wb[abase - 8 s0 - 28 + 4 i]
                            e = s % 4
                            ladder = 32 * q + 128 + g - tig - 8 * (s - e) - 28 + 4 * np.arange(14)
                            j = 4 * m + 6 - 2 * e
                            words = list(ladder[[j + 1, j + 3, j, j + 2]])
                        assert 0 <= min(words) and max(words) < len(buf)  # inside the staged w buffer
                        A[g, tig], A[g + 8, tig], A[g, tig + 4], A[g + 8, tig + 4] = buf[words]
                        for n in range(NT):
                            row = ks[8 * n + g]
                            Bm[n, tig, g], Bm[n, tig + 4, g] = row[8 * s + tig], row[8 * s + tig + 4]
                    for n in range(NT):
                        D = A @ Bm[n]
                        for lane in range(32):
                            g, tig = lane >> 2, lane & 3
                            acc[q, m, n, lane] += (D[g, 2 * tig], D[g, 2 * tig + 1], D[g + 8, 2 * tig],
                                                   D[g + 8, 2 * tig + 1])
    out = np.full((BN, 128), np.nan)  # timex_mma_store: (row t, column b) fragments -> out[b][t]
    for q in range(4):
        for lane in range(32):
            g, tig = lane >> 2, lane & 3
            for m in range(2):
                for n in range(NT):
                    t = 32 * q + 16 * m + g
                    b = 8 * n + 2 * tig
                    out[b, t], out[b + 1, t], out[b, t + 8], out[b + 1, t + 8] = acc[q, m, n, lane]
    return out


@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("B, T, NT", [(3, 130, 1), (17, 300, 4), (9, 1, 2)])
def test_tensor_core_fragment_math_matches_the_definition(rng, version, B, T, NT):
    w, k = rng.standard_normal((1, T)), rng.standard_normal((B, 1, T))
    want = F.reference_timex(w, k, 0.0)[:, 0]
    ntiles = -(-T // 128)
    for ti in range(ntiles):
        got = emulate_mma_block(version, w[0], k[:, 0], ti, NT)
        n = min(128, T - ti * 128)
        np.testing.assert_allclose(got[:B, :n], want[:, ti * 128:ti * 128 + n], rtol=1e-12, atol=1e-12)


def tf32_split(x):
    """TimexTf32<true> (timex.cuh) in NumPy: (big, small) float32 arrays for float32 ``x``; cvt.rna.tf32.f32
    rounds the magnitude half away from zero to 10 mantissa bits (past the largest TF32 value: Inf)."""
    x = np.asarray(x, np.float32)
    xb = x.view(np.uint32)

    def tf32(v):
        b = (v.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
        return np.where(np.isnan(v), np.uint32(0x7FFFFFFF), b).astype(np.uint32)

    def nonfinite(bits):
        return (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)

    with np.errstate(invalid="ignore", over="ignore"):
        big = tf32(x)
        big = np.where(nonfinite(big) & ~nonfinite(xb), xb & np.uint32(0xFFFFE000), big).astype(np.uint32)
        small = tf32((x - big.view(np.float32)).astype(np.float32))
        inf = (xb & np.uint32(0x7FFFFFFF)) == np.uint32(0x7F800000)
        small = np.where(nonfinite(xb), np.where(inf, xb, np.uint32(0)), small).astype(np.uint32)
        big = np.where(inf, (xb & np.uint32(0x80000000)) | np.uint32(0x7F7FE000), big).astype(np.uint32)
    return big.view(np.float32), small.view(np.float32)


def test_3xtf32_products_of_special_values_are_ieee():
    """The float32 tensor-core product small_w * big_k + big_w * small_k + big_w * big_k of the split above has
    IEEE's class for Inf, NaN, zero and values near the float32 maximum (NaN only where w * k is NaN, Infs of
    the right sign), and w * k's value to ~2^-21 elsewhere."""
    fmax = np.array(0x7F7FFFFF, np.uint32).view(np.float32)  # not np.finfo: it warns under jittor's flush to zero
    specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 0.5, -1.75, 3.0e-30, 1.2345678, -7.654321e5,
                         fmax, -fmax, fmax * np.float32(0.99997), 2.0 ** 127], np.float32)
    w, k = np.meshgrid(specials, specials)
    (wb, ws), (kb, ks) = tf32_split(w), tf32_split(k)
    with np.errstate(invalid="ignore", over="ignore"):
        got = ws.astype(np.float64) * kb + wb.astype(np.float64) * ks + wb.astype(np.float64) * kb
        want = w.astype(np.float64) * k
    assert np.array_equal(np.isnan(got), np.isnan(want))
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf])
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=2.0 ** -20, atol=0)


# ---- nvcc: every instantiation the dispatcher can render compiles for sm_90 -------------------------------

def _all_configs():
    """One config per rendered source: forward tm x index type, grad_w x index type."""
    fwd = X.select_config((32, 768, 768), "forward")
    gw = X.select_config((32, 768, 768), "grad_w")
    out = [dataclasses.replace(fwd, tm=tm, index_t=it) for tm in (1, 2, 4) for it in ("int", "long long")]
    out += [dataclasses.replace(gw, index_t=it) for it in ("int", "long long")]
    out += [dataclasses.replace(X.select_config((b, 768, 768), tensor_cores=v, dtype="float16"), index_t=it)
            for v in (X.TC_MMA, X.TC_MMA3) for b in (8, 16, 32) for it in ("int", "long long")]
    return out


def test_every_configuration_is_in_the_menu():
    for cfg in _all_configs():
        if cfg.kernel == "forward":
            assert X._fwd_entry(cfg, "cuda") in X._FWD_CUDA_MENU
            if cfg.variant.startswith("fwd_mma"):
                continue
            assert X._fwd_entry(cfg, "cpu") in X._FWD_CPU_MENU


@pytest.mark.nvcc
def test_nvcc_compiles_every_instantiation():
    from nvcc_util import compile_check

    configs = _all_configs()
    forward = ("fwd_single", "fwd_mma", "fwd_mma3")
    assert {(c.variant, c.tm, c.index_t) for c in configs} == (
        {(v, tm, it) for v in forward for tm in (1, 2, 4) for it in ("int", "long long")}
        | {("gw_tiled", 1, it) for it in ("int", "long long")})
    header = ("#include <map>\n#include <string>\n#include <iostream>\n#define LOGf std::cerr\n"
              + ops._codegen.header(["common", "timex"]) + X._FWD_CUDA_MENU.render(X._MENU_HEAD, "timex"))
    body = ["TimexFwdParams p = {}; TimexGwParams q = {};"]
    for dtype in DTYPES:
        for it in ("int", "long long"):
            body.append(f"timex_fwd_menu<{dtype}, {it}>(0, ({dtype}*)0, ({dtype}*)0, ({dtype}*)0, p);")
            body.append(f"timex_gw_launch<{dtype}, {it}>(({dtype}*)0, ({dtype}*)0, ({dtype}*)0, (float*)0, q);")
    ok, log = compile_check(header, "\n".join(body))
    assert ok, log[-6000:]
