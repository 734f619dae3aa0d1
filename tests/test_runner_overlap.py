"""The parent's overlap (inputs prepared ahead, cases judged while the worker runs others), run on the CPU with
the toy family: the same verdicts as one case at a time, also when memory admits only one case in flight."""
import os
import re

import numpy as np
import pytest

from ops.scoring import budget, prepare, runner
from ops.scoring.families import load_families

IDS = ["toy/fwd/ok", "toy/bwd/ok", "toy/fwd/wrong", "toy/fwd/raise", "toy/fwd/after"]


@pytest.fixture
def toy_items(toy_worker_env):
    by_id = {c.id: (f, c) for f in load_families() for c in f.all_cases()}
    return [by_id[i] for i in IDS]


def verdicts(items, tmp_path, waits=None, **kwargs):
    seen = []
    _, results = runner.run_cases(items, device="cpu", impl="ops", references=["naive"], seed=None, repeats=1,
                                  timeout_s=120, scratch=str(tmp_path), on_result=lambda r: seen.append(r.case_id),
                                  **kwargs)
    assert sorted(seen) == sorted(IDS)  # every case reported once
    if waits is not None:  # the worker's idle time around each case (overlapped runs)
        waits.extend({k: v for k, v in r.phases.items() if k.startswith("wait_")} for r in results)
    # every correct case had its checked call's output and at least one timed call's judged
    assert all(r.checked >= 2 for r in results if r.correct), [(r.case_id, r.checked) for r in results]
    return [(r.case_id, r.correct, r.why.split(":")[0]) for r in results]


@pytest.mark.parametrize("limit", [1 << 40, 1])  # plenty; a single byte: every case alone in flight
def test_overlapped_cases_get_the_same_verdicts(toy_items, tmp_path, monkeypatch, limit):
    alone = verdicts(toy_items, tmp_path / "alone", overlap=False)
    assert [v[1] for v in alone] == [True, True, False, False, True]
    monkeypatch.setattr(budget, "in_flight_limit", lambda: limit)
    waits = []
    assert verdicts(toy_items, tmp_path / "overlap", overlap=True, waits=waits) == alone
    assert len(waits) == len(IDS) and all(w["wait_prepare"] >= 0 and w["wait_judges"] >= 0 for w in waits)


def test_footprint_counts_every_set_and_the_host_dtype():
    families = {f.name: f for f in load_families()}
    fam = families["permute"]
    big = next(c for c in fam.all_cases() if c.id == "permute/fwd/ta_24300x11520_bf16")
    elements = 2 * 24300 * 11520
    sets = prepare.input_sets(fam, big)
    assert sets == 2 and prepare.timed_sets(fam, big) == [0, 1]  # large: the check set and one fresh, in turn
    blocks = budget.PREPARE_THREADS * budget.JUDGES * budget.JUDGE_BYTES_PER_ELEMENT * budget.ROW_BLOCK_ELEMENTS
    assert budget.case_footprint(fam, big) == 3 * 4 * elements * sets + blocks  # judged in rows: no references held
    pool = families["max_pool3d"]
    whole = next(c for c in pool.all_cases() if c.dtype == "float16" and c.direction == "bwd")
    elements = sum(int(np.prod(s)) for s in whole.shapes)
    assert budget.case_footprint(pool, whole) == (3 * 2 + 16) * elements * prepare.input_sets(pool, whole)
    small = next(c for c in pool.all_cases() if c.id == "max_pool3d/fwd/k2s2_tiny_1x1x4x4x4")
    assert prepare.timed_sets(pool, small) == [1, 2, 3] and prepare.input_sets(pool, small) == 4


def test_judged_in_rows_agrees_with_expected_rows():
    """The footprint's assumption holds: a case said to be judged in rows gets blocks of rows from its family,
    and one that is not gets none (small cases of every family, zeros of their shapes)."""
    seen = set()
    for fam in load_families():
        for c in fam.all_cases():
            if sum(int(np.prod(s)) for s in c.shapes) > 1 << 22:
                continue
            arrays, grads = fam.zero_inputs(c)
            rows = fam.expected_rows(c, arrays, grads if c.direction == "bwd" else None)
            assert fam.judged_in_rows(c) == (rows is not None), c.id
            seen.add((fam.name, rows is not None))
    assert ("permute", True) in seen and ("max_pool3d", False) in seen


def test_an_interrupt_keeps_the_judged_cases_and_reports_the_rest_not_run(toy_items, tmp_path):
    """Interrupted (as get_score's signal handler raises it) while cases are in flight: the cases judged by then
    keep their verdicts, the others are reported as not run."""
    seen = []

    def on_result(r):
        seen.append(r.case_id)
        if len(seen) == 2:
            raise runner.Interrupted("SIGTERM")

    _, results = runner.run_cases(toy_items, device="cpu", impl="ops", references=["naive"], seed=None, repeats=1,
                                  timeout_s=120, scratch=str(tmp_path), on_result=on_result, overlap=True)
    assert [r.case_id for r in results] == IDS
    kept = [r for r in results if not r.why.startswith("not run")]
    assert [r.case_id for r in kept] == seen[:len(kept)] and len(kept) >= 2
    assert all(r.why == "not run: interrupted (SIGTERM)" for r in results if r not in kept)
    assert any(r.why == "not run: interrupted (SIGTERM)" for r in results)


def test_large_cases_time_the_check_set_and_one_fresh_set_in_turn(toy_items, tmp_path, monkeypatch):
    """Every case counted large: the same verdicts, from the check call's output and timed calls' outputs on
    copies of the check set and of one fresh set."""
    small = verdicts(toy_items, tmp_path / "small", overlap=False)
    monkeypatch.setattr(prepare, "SMALL_CASE_BYTES", 0)
    large = verdicts(toy_items, tmp_path / "large", overlap=False)
    assert large == small


def test_a_cache_by_shape_fails_on_the_fresh_set_of_a_large_case(tmp_path, monkeypatch):
    """cheat_cache (the output of the first input of a shape) on large cases: every timed call, on a copy of the
    check set or of the fresh set, gets a stale answer."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(root, "tests"), root,
                                                      os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(prepare, "SMALL_CASE_BYTES", 0)
    wanted = {"permute/fwd/cpu_021_f32", "max_pool3d/fwd/cpu_k2s2"}
    items = [(f, c) for f in load_families() for c in f.all_cases() if c.id in wanted]
    assert len(items) == 2
    _, results = runner.run_cases(items, device="cpu", impl="cheat_cache", references=["naive"], seed=None,
                                  repeats=1, timeout_s=120, scratch=str(tmp_path), overlap=False)
    for r in results:
        assert not r.correct and re.match(r"timed call \d+ on input set [01]", r.why), (r.case_id, r.why)
