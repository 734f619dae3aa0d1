"""The parent's overlap (inputs prepared ahead, cases judged while the worker runs others), run on the CPU with
the toy family: the same verdicts as one case at a time, also when memory admits only one case in flight."""
import pytest

from ops.scoring import runner
from ops.scoring.families import load_families

IDS = ["toy/fwd/ok", "toy/bwd/ok", "toy/fwd/wrong", "toy/fwd/raise", "toy/fwd/after"]


@pytest.fixture
def toy_items(toy_worker_env):
    by_id = {c.id: (f, c) for f in load_families() for c in f.all_cases()}
    return [by_id[i] for i in IDS]


def verdicts(items, tmp_path, **kwargs):
    seen = []
    _, results = runner.run_cases(items, device="cpu", impl="ops", references=["naive"], seed=None, repeats=1,
                                  timeout_s=120, scratch=str(tmp_path), on_result=lambda r: seen.append(r.case_id),
                                  **kwargs)
    assert sorted(seen) == sorted(IDS)  # every case reported once
    return [(r.case_id, r.correct, r.why.split(":")[0], r.checked) for r in results]


@pytest.mark.parametrize("limit", [1 << 40, 1])  # plenty; a single byte: every case alone in flight
def test_overlapped_cases_get_the_same_verdicts(toy_items, tmp_path, monkeypatch, limit):
    alone = verdicts(toy_items, tmp_path / "alone", overlap=False)
    assert [v[1] for v in alone] == [True, True, False, False, True]
    monkeypatch.setattr(runner, "in_flight_limit", lambda: limit)
    assert verdicts(toy_items, tmp_path / "overlap", overlap=True) == alone


def test_footprint_counts_every_set_and_the_host_dtype():
    fam = next(f for f in load_families() if f.name == "permute")
    big = next(c for c in fam.all_cases() if c.id == "permute/fwd/ta_24300x11520_bf16")
    elements = 2 * 24300 * 11520
    assert runner.case_footprint(fam, big) == (3 * 4 + 16) * elements * (1 + runner.timed_sets(fam, big))


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
