"""Modules that re-export ops and change one thing, graded on small case subsets on the CPU: each scores 0 on
every case it affects. The verdicts come from the parent process, on outputs of the checked call and of timed
calls drawn per round, every timed call on inputs no call had before (``ops.scoring.fresh``)."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from ops.scoring import grading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMED_CALL = re.compile(r"timed calls? \d+")


def run_grader(impl, *args, env_extra=None, tmp_path, device="cpu", reports=()):
    out = tmp_path / f"{impl}-{device}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), ROOT,
                                                       os.environ.get("PYTHONPATH", "")]), **(env_extra or {}))
    # On the GPU the compile pass compiles a run's kernels in parallel; on the CPU the few kernels compile fast
    warm = ["--no-warm"] if device == "cpu" else []
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "get_score.py"), "--device", device, "--impl", impl,
                           "--no-progress", *warm, "--repeats", "1", "--references", "naive", "--json",
                           str(out), *reports, *args], capture_output=True, text=True, env=env, timeout=600)
    assert out.exists(), proc.stderr[-3000:]
    return {r["case_id"]: r for r in json.loads(out.read_text())["results"]}, proc


def grade(impl, *args, status=1, **kwargs):
    """The results of grading ``impl``; the run must end with ``status`` (1: a case wrong, 0: all correct)."""
    results, proc = run_grader(impl, *args, **kwargs)
    assert proc.returncode == status, proc.stderr[-3000:]
    return results


def assert_all_zero(results, why):
    assert results
    for case_id, r in results.items():
        assert r["points"] == 0 and not r["correct"], (case_id, r["why"])
        assert (why.search(r["why"]) if isinstance(why, re.Pattern) else why in r["why"]), (case_id, r["why"])


def plain_cases(results):
    """The results less the edge cases (at least one is left)."""
    plain = {k: v for k, v in results.items() if "edge" not in k}
    assert plain
    return plain


def test_cached_outputs_fail_on_the_timed_calls(tmp_path):
    results = grade("cheat_cache", "-k", "cpu_k2s2,cpu_10_int8,paddle0-1785x1-to-1785x128-float32", "--direction",
                    "fwd", tmp_path=tmp_path)
    assert_all_zero(results, TIMED_CALL)


# The replay store is a folder the worker may write: isolation off (with it, a store would live in ~/.cache).
REPLAY_ENV = {"OPS_GRADER_ISOLATION": "none"}


def check_replayed_answers_fail(tmp_path, cases, *record_flags, **where):
    """cheat_replay run twice with one seed on ``cases``: the first run records its answers (``record_flags``
    added to it), the second replays them and must still earn nothing on the timed calls."""
    store = tmp_path / "answers"
    store.mkdir()
    args = ("-k", cases, "--direction", "fwd", "--seed", "5")
    env = {"CHEAT_REPLAY_DIR": str(store), **REPLAY_ENV}
    grade("cheat_replay", *args, *record_flags, env_extra=env, tmp_path=tmp_path, **where)
    assert list(store.iterdir())  # the first run recorded its answers (and failed the timed calls)
    results = grade("cheat_replay", *args, env_extra=env, tmp_path=tmp_path, **where)
    assert_all_zero(plain_cases(results), TIMED_CALL)  # the seeded checked call itself was answered right


def test_replayed_answers_of_a_seeded_run_fail_on_the_fresh_timed_inputs(tmp_path):
    check_replayed_answers_fail(tmp_path, "cpu_k2s2_f16,cpu_odd_f16")


def test_a_module_that_patches_the_judge_in_its_process_is_still_judged(tmp_path):
    results = grade("cheat_judge", "--op", "permute", "-k", "cpu_021_f32,cpu_10_int8", tmp_path=tmp_path)
    assert_all_zero(results, "checked call")


@pytest.mark.parametrize("references", ["", "naive"])
def test_outputs_computed_only_when_the_grader_reads_them_fail(tmp_path, references):
    """cheat_lazy hands out unwritten memory and replaces jt.Var's accessors to compute an answer when it is read;
    the grader reads with jittor as it was, also in a run that times no reference (a class against --tiers)."""
    results = grade("cheat_lazy", "--op", "permute", "--direction", "fwd", "-k", "cpu_021_f32,cpu_10_int8,cpu_2301",
                    "--references", references, tmp_path=tmp_path)
    assert_all_zero(results, re.compile(r"(timed|checked) call"))


def test_a_module_that_sabotages_pytorch_in_its_process_does_not_reach_its_reference(tmp_path):
    pytest.importorskip("torch")
    results = grade("cheat_torch", "-k", "cpu_021_f32,cpu_k2s2", "--references", "naive,torch", status=0,
                    tmp_path=tmp_path)
    assert {c.split("/")[0] for c in results} == {"permute", "max_pool3d"} and len(results) >= 3
    for case_id, r in results.items():
        assert r["correct"] and r["refs"]["torch"].get("error") is None, (case_id, r["refs"]["torch"])


def test_a_profile_function_set_by_the_module_does_not_reach_the_references(tmp_path):
    results = grade("cheat_profile", "--op", "permute", "--direction", "fwd", "-k", "cpu_021_f32,cpu_10_int8",
                    status=0, tmp_path=tmp_path)
    assert results
    for case_id, r in results.items():
        assert r["correct"] and r["refs"]["naive"].get("error") is None, (case_id, r["refs"]["naive"])


def test_a_module_that_adds_methods_to_jittors_var_keeps_them_between_the_references(tmp_path):
    """class_var_method's permute calls a method it added to jt.Var: taken away while the references are timed,
    given back before its own calls."""
    results = grade("class_var_method", "--op", "permute", "-k", "cpu_021_f32,cpu_10_int8", status=0,
                    tmp_path=tmp_path)
    assert results and all(r["correct"] for r in results.values()), {k: r["why"] for k, r in results.items()}


def test_wrong_output_dtypes_fail(tmp_path):
    results = grade("cheat_dtype", "-k", "cpu_k2s2_f16,cpu_k3s2p1_bf16,cpu_10_int8", "--direction", "fwd",
                    tmp_path=tmp_path)
    assert_all_zero(results, "dtype")
    assert results["permute/fwd/cpu_10_int8"]["why"].endswith("dtype int64 != expected int8")


def test_max_pool3d_values_a_unit_off_fail(tmp_path):
    results = grade("cheat_ulp", "--op", "max_pool3d", "--direction", "fwd", "-k",
                    "cpu_k2s2,cpu_k3s1_idx,cpu_k3s2p1_bf16,cpu_ceil_edge_f16", tmp_path=tmp_path)
    assert_all_zero(results, "elements differ (exact op)")


def test_a_gradient_off_by_1e_2_in_one_element_fails_even_in_long_sums(tmp_path):
    results = grade("cheat_grad", "--op", "expand_as", "--direction", "bwd", "-k",
                    "paddle0-1785x1-to-1785x128-float,small2,small6,scalar,ends,paddle1-5x1x1-to-5x128x128-float32",
                    tmp_path=tmp_path)
    assert len(results) == 7
    assert_all_zero(results, "first at (0")


def test_work_on_the_host_shows_in_the_time_that_earns_points(tmp_path):
    """A module that computes on the host and hands the result through one trivial kernel: its kernel time is
    that kernel's, its wall time holds the host work, and the points use the larger (whether it then earns
    points depends on the references' speed on this machine: not asserted)."""
    results = grade("cheat_host", "-k", "cpu_k2s2,cpu_021_f32,cpu_ta_f32", "--direction", "fwd", "--op",
                    "max_pool3d", "--op", "permute", tmp_path=tmp_path, status=0)
    plain = {k: v for k, v in results.items() if k.split("/")[-1] in ("cpu_k2s2", "cpu_021_f32", "cpu_ta_f32")}
    assert len(plain) == 3
    for case_id, r in plain.items():
        ours = r["ours"]
        assert r["correct"], (case_id, r["why"])
        assert ours["wall_ms"] > ours["kernel_ms"] and ours["ms"] == ours["wall_ms"], (case_id, ours)
        assert r["points"] == grading.points_for(grading.gbps(r["nbytes"], ours["ms"]), r["tiers"], True)


def test_waiting_for_work_done_elsewhere_counts(tmp_path):
    """On the CPU the grader times by the worker's CPU time (other processes do not inflate it); a call that
    waits instead of computing is timed by the wall clock, its wait included."""
    results = grade("cheat_wait", "--op", "permute", "--direction", "fwd", "-k", "cpu_021_f32,cpu_10_int8",
                    tmp_path=tmp_path, status=0)
    for case_id, r in results.items():
        assert r["correct"], (case_id, r["why"])
        assert r["ours"]["ms"] >= 2.0 and r["ours"]["call_ms"] >= 2.0, (case_id, r["ours"])
        # the naive permutes of these cases take well under 0.2 ms a call: 2 ms earns nothing
        assert r["points"] == 0 and r["refs"]["naive"]["ms"] < 0.2, (case_id, r["points"], r["refs"]["naive"])


def assert_sample_cache_earns_nothing(results, magnitudes):
    """cheat_sample's verdicts: 0 points everywhere; a case judged right computed every call (2 ms each, in CPU
    time less where others took turns), a wrong one was caught on a timed call; with the sample of magnitudes at
    least one remembered answer was another input's, with the plain sample none (no two calls' inputs agree)."""
    for case_id, r in results.items():
        assert r["points"] == 0, (case_id, r["points"])
        if r["correct"]:
            assert r["ours"]["ms"] >= 1.0, (case_id, r["ours"])
        else:
            assert TIMED_CALL.search(r["why"]), (case_id, r["why"])
    assert all(r["correct"] for r in results.values()) == (magnitudes == "0")


SAMPLE_CACHE_STATUS = [("0", 0), ("1", 1)]


@pytest.mark.parametrize("magnitudes,status", SAMPLE_CACHE_STATUS)
def test_a_cache_by_a_sample_of_the_input_values_scores_zero(tmp_path, magnitudes, status):
    """Answers remembered by 16 values of each input, each computed one costing 2 ms: no timed call's inputs
    were seen before, so every call computes (right, and too slow for points); remembered by their magnitudes
    (which the timed calls' inputs of a float set share but for its smallest arrays), the remembered answer is
    another input's (wrong)."""
    results = grade("cheat_sample", "--direction", "fwd", "-k",
                    "cpu_021_f32,cpu_10_int8,cpu_k2s2,cpu_tiny,paddle1-5x1x1", "--op", "permute", "--op", "max_pool3d",
                    "--op", "expand_as",
                    env_extra={"CHEAT_SAMPLE_ABS": magnitudes}, tmp_path=tmp_path, status=status)
    assert len(results) >= 8
    assert_sample_cache_earns_nothing(results, magnitudes)


@pytest.mark.parametrize("mode", ["every2", "first8", "empty"])
def test_a_module_that_computes_only_some_calls_scores_zero(tmp_path, mode):
    """The previous call's output for every other call, the 8th call's for every call after it, or memory nobody
    wrote: a checked timed call's output is wrong, or two calls' samples agree where their answers differ."""
    results = grade("cheat_skip", "--direction", "fwd", "-k", "cpu_021_f32,cpu_k2s2,cpu_k8s1,paddle1-5x1x1",
                    "--op", "permute", "--op", "max_pool3d", "--op", "expand_as", "--repeats", "2",
                    env_extra={"CHEAT_SKIP": mode}, tmp_path=tmp_path)
    assert len(results) >= 6
    # (a case after one of the same shapes gets the earlier case's answer at its checked call already)
    assert_all_zero(results, re.compile(f"{TIMED_CALL.pattern}|checked call"))


def test_clocks_and_syncs_patched_in_the_module_do_not_reach_the_timing(tmp_path):
    """A module that spins 2 ms a call and runs the clocks of its process slow, makes jittor's syncs do nothing
    and slows the naive references' op: its calls are timed at their 2 ms and earn nothing, and the naive
    permute is timed at its own speed."""
    results = grade("cheat_clock", "--op", "permute", "--direction", "fwd", "-k", "cpu_021_f32,cpu_10_int8",
                    tmp_path=tmp_path, status=0)
    assert len(results) == 3  # (and cpu_021_f32_edge)
    for case_id, r in results.items():
        assert r["correct"], (case_id, r["why"])
        # 2 ms of spinning a call (its CPU time: less where other processes took turns on the machine)
        assert r["ours"]["ms"] >= 1.0 and r["points"] == 0, (case_id, r["ours"], r["points"])
        assert r["refs"]["naive"]["ms"] < 0.5, (case_id, r["refs"]["naive"])


@pytest.mark.parametrize("impl", ["cheat_thread", "cheat_helper"])
def test_work_handed_to_a_thread_or_a_process_of_the_module_is_not_timed_clean(tmp_path, impl):
    """On the CPU clock a round in which threads other than the calling one, or live processes below the worker,
    used CPU is run again: a module that hands its work to a thread (cheat_thread) or a helper process
    (cheat_helper) of its own is never timed clean, and earns nothing."""
    results = grade(impl, "--op", "permute", "--direction", "fwd", "-k", "cpu_021_f32", tmp_path=tmp_path)
    assert results
    for case_id, r in results.items():
        assert r["points"] == 0 and not r["correct"] and "not measured" in r["why"], (case_id, r["why"])
        assert r["ours"]["discarded"] > 0


# cheat_detach's mark and the file among the grader's own it writes (not imported here: its import detaches)
MARK = "rewritten by cheat_detach"
GRADER_FILE = os.path.join(ROOT, "ops", "scoring", "cheat_detach_was_here.txt")


def test_a_process_left_behind_is_killed_and_the_reports_stand(tmp_path):
    """A module that double-forks a process at import to rewrite the reports once the grader has gone (and the
    grader's files at once): the process is gone before the reports are written, and they are the grader's 5 s
    after it exited."""
    md, tiers = tmp_path / "r.md", tmp_path / "tiers.json"
    json_path = tmp_path / "cheat_detach-cpu.json"
    results, proc = run_grader("cheat_detach", "--op", "permute", "--direction", "fwd", "-k", "cpu_021_f32",
                               tmp_path=tmp_path, reports=("--markdown", str(md), "--save-tiers", str(tiers)),
                               env_extra={"CHEAT_DETACH_PATHS": os.pathsep.join(map(str, (json_path, md, tiers)))})
    assert proc.returncode == 0, proc.stderr[-3000:]
    try:
        written = {p: p.read_text() for p in (json_path, md, tiers)}
        time.sleep(5)
        for path, text in written.items():
            assert MARK not in text and path.read_text() == text, path
        assert results["permute/fwd/cpu_021_f32"]["correct"]
        assert "isolation:" in proc.stderr
        if "isolation: Landlock" in proc.stderr or "isolation: bubblewrap" in proc.stderr:
            assert not os.path.exists(GRADER_FILE)  # (where the machine has neither, it could write there)
    finally:
        if os.path.exists(GRADER_FILE):
            os.unlink(GRADER_FILE)


# The same modules on the GPU's cases: (module, its arguments, the reason every affected case must give). Two
# runs for the replay (the first records). The host cheat's output is right: it must lose its points to the
# wall clock that holds the host work (a host transpose of 16 MB against a GPU kernel of tens of microseconds).
GPU_CHEATS = {
    "cheat_cache": (("-k", "k2s2_tiny,10_int64,paddle1-5x1x1-to-5x128x128-float32", "--direction", "fwd"),
                    TIMED_CALL),
    "cheat_judge": (("--op", "permute", "-k", "10_int64,021_int8"), "checked call"),
    "cheat_dtype": (("-k", "k2s2_f16_16x64,k3s2p1_bf16_8x64,021_int8", "--direction", "fwd"), "dtype"),
    "cheat_ulp": (("--op", "max_pool3d", "--direction", "fwd", "-k",
                   "k2s2_tiny,k3s2p1_bf16_8x64,k2s2_f16_16x64,k2s2_idx_8x32"), "elements differ (exact op)"),
    # Not the 67M-term scalar-1-to-8192x8192: its float32 sum's bound is 0.06-0.12 (five seeds), and honest float32
    # sums err by 0.003-0.017 there (serial blocks of 4096; six seeds): 1e-2 is within rounding (README).
    "cheat_grad": (("--op", "expand_as", "--direction", "bwd", "-k",
                    "paddle0-1785x1-to-1785x128-float,paddle1-5x1x1-to-5x128x128-float32,ends"),
                   "first at (0"),
}


@pytest.mark.cuda
@pytest.mark.parametrize("impl", sorted(GPU_CHEATS))
def test_cheats_score_zero_on_the_gpu(impl, tmp_path):
    args, why = GPU_CHEATS[impl]
    assert_all_zero(grade(impl, *args, tmp_path=tmp_path, device="cuda"), why)


GPU_CASES = ("--direction", "fwd", "-k", "k2s2_tiny,k2s2_8x32x32x64x64,021_f32_16MB,021_f32_128MB,"
             "paddle1-5x1x1-to-5x128x128-float32", "--op", "permute", "--op", "max_pool3d", "--op", "expand_as")


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["every2", "first8", "empty"])
def test_skipped_calls_score_zero_on_the_gpu(mode, tmp_path):
    results = grade("cheat_skip", *GPU_CASES, env_extra={"CHEAT_SKIP": mode}, tmp_path=tmp_path, device="cuda")
    plain = plain_cases(results)
    assert len(plain) >= 4
    assert_all_zero(plain, TIMED_CALL)


@pytest.mark.cuda
@pytest.mark.parametrize("magnitudes,status", SAMPLE_CACHE_STATUS)
def test_a_cache_by_a_sample_scores_zero_on_the_gpu(magnitudes, status, tmp_path):
    results = grade("cheat_sample", *GPU_CASES, env_extra={"CHEAT_SAMPLE_ABS": magnitudes}, tmp_path=tmp_path,
                    device="cuda", status=status)
    assert len(results) >= 4
    assert_sample_cache_earns_nothing(results, magnitudes)


@pytest.mark.cuda
def test_patched_clocks_do_not_reach_the_timing_on_the_gpu(tmp_path):
    results = grade("cheat_clock", "--op", "permute", "--direction", "fwd", "-k", "021_f32_16MB,10_int64",
                    tmp_path=tmp_path, device="cuda", status=0)
    for case_id, r in plain_cases(results).items():
        assert r["correct"] and r["ours"]["ms"] >= 2.0 and r["points"] == 0, (case_id, r["ours"], r["points"])


@pytest.mark.cuda
def test_a_process_left_behind_is_killed_on_the_gpu(tmp_path):
    md = tmp_path / "r.md"
    json_path = tmp_path / "cheat_detach-cuda.json"
    _, proc = run_grader("cheat_detach", "--op", "permute", "--direction", "fwd", "-k", "021_f32_16MB",
                         tmp_path=tmp_path, device="cuda", reports=("--markdown", str(md)),
                         env_extra={"CHEAT_DETACH_PATHS": os.pathsep.join(map(str, (json_path, md)))})
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = {p: p.read_text() for p in (json_path, md)}
    time.sleep(5)
    assert all(MARK not in text and p.read_text() == text for p, text in written.items())


@pytest.mark.cuda
def test_replayed_answers_fail_on_the_gpu(tmp_path):
    # The recording run skips the compile pass: the pass calls the module on uninitialized inputs first, and the
    # cheat would record those answers instead of the seeded checked call's.
    check_replayed_answers_fail(tmp_path, "k2s2_tiny,021_int8", "--no-warm", device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("impl", ["cheat_host", "cheat_wait"])
def test_work_outside_the_gpu_kernels_earns_no_points_on_the_gpu(impl, tmp_path):
    cases = "k2s2_8x32x32x64x64,021_f32_16MB,ta_batched_f32" if impl == "cheat_host" else "021_f32_16MB,10_int64"
    results = grade(impl, "-k", cases, "--direction", "fwd", "--op", "max_pool3d", "--op", "permute",
                    tmp_path=tmp_path, device="cuda", status=0)
    for case_id, r in plain_cases(results).items():
        ours = r["ours"]
        assert r["correct"], (case_id, r["why"])
        refs = {name: t["error"] or t["ms"] for name, t in r["refs"].items()}
        assert ours["ms"] >= ours["kernel_ms"] and r["points"] == 0, (case_id, ours, r["points"], r["tiers"], refs)


@pytest.mark.cuda
def test_outputs_computed_only_when_read_fail_on_the_gpu(tmp_path):
    results = grade("cheat_lazy", *GPU_CASES, "--references", "", tmp_path=tmp_path, device="cuda")
    assert len(results) >= 4
    assert_all_zero(results, re.compile(r"(timed|checked) call"))


@pytest.mark.cuda
def test_sabotaged_pytorch_does_not_reach_its_reference_on_the_gpu(tmp_path):
    """On the GPU cheat_torch's CUDA events would time every PyTorch call at 1000 s."""
    results = grade("cheat_torch", "-k", "k2s2_tiny,021_f32_16MB", "--references", "naive,torch", status=0,
                    tmp_path=tmp_path, device="cuda")
    assert {c.split("/")[0] for c in results} == {"permute", "max_pool3d"} and len(results) >= 3
    for case_id, r in results.items():
        torch_tier = r["refs"]["torch"]
        assert r["correct"] and torch_tier.get("error") is None and torch_tier["ms"] < 100, (case_id, torch_tier)
