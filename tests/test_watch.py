"""The grader's watch over our timed calls (ops/scoring/harness.py:Watch): which calls go back whole."""
import numpy as np

from ops._jittor import jt
from ops.scoring import harness as H


def watched(out_elements, input_bytes, rounds=6, calls=40, windows=4):
    """Run a Watch through ``rounds`` rounds of ``calls`` calls; returns the call numbers that went back whole."""
    saved = []
    watch = H.Watch(np.random.default_rng(7), lambda tag, outs: saved.append(tag) or [tag])
    outs = [jt.zeros((out_elements,), "float32")]
    watch.prime(outs, on_device=False, input_bytes=input_bytes)
    number = 0
    for r in range(rounds):
        checked = watch.plan(calls)
        kept = [(0, number + i, outs) for i in sorted(checked)]
        held = [(0, number + w * (calls // windows), outs) for w in range(windows)]
        watch.round_done([10.0 - r] * windows, held, kept)  # every round faster than the last
        number += calls
    watch.finish()
    return [watch.checks[tag][1] for tag in saved]


def test_a_cheap_case_checks_a_call_of_every_round_and_its_fastest_window_once():
    numbers = watched(16, 1024)
    assert len(numbers) == 6 + 1 and len(set(numbers)) == len(numbers)
    assert numbers[-1] == 5 * 40  # the last (fastest) round's first window's held call, at the end


def test_a_costly_case_checks_one_drawn_call_and_its_fastest_window():
    costly = H.SAMPLE_CHECK_BYTES  # inputs alone past the bound: the parent's reference of a call costs seconds
    draws = [watched(16, costly, calls=40 + seed) for seed in range(8)]
    assert all(len(numbers) == 2 for numbers in draws)
    drawn = {numbers[1] // 40 for numbers in draws}  # the round each drawn call was in
    assert len(drawn) > 1  # not always the same round



def test_a_checked_call_judged_already_is_not_judged_again():
    """The parent judges a class child's checked call while the worker times (a wrong one ends the rounds); the
    case's judging takes that verdict instead of reading and judging the files again."""
    from ops.scoring.families import load_families
    from ops.scoring.judging import judge_outputs
    fam = next(f for f in load_families() if f.name == "permute")
    case = fam.all_cases()[0]
    wrong = (False, "checked call, output 0: 3 of 8 differ", 1.0, 1)
    files = {"check": [("no_such_file.npy", "float32")]}  # (never read)
    assert judge_outputs(fam, case, None, files, known={"check": wrong}) == wrong
    assert judge_outputs(fam, case, None, files, known={"check": (True, "", 0.0, 1)}) == (True, "", 0.0, 1)



def test_agreeing_samples_are_judged_unless_sparse_where_the_output_is_sparse():
    """A fresh call flips signs, so a sparse gradient's samples (mostly zeros) agree honestly among thousands of
    calls: such a pair is not judged where the checked call's reference is as sparse at those positions; samples
    sparse where it is dense (memory nobody wrote) are, and so is every pair of dense samples."""
    from types import SimpleNamespace
    from ops.scoring.judge import Expected
    from ops.scoring.judging import REPEAT_MIN_NONZERO, sparse_agreement
    positions = list(range(0, 128, 2))
    dense_values = np.arange(1.0, 129.0)
    sparse_values = np.where(np.arange(128) % 16 == 0, dense_values, 0.0)  # 8 of the 64 sampled are nonzero

    def pair(values):
        sampled = np.asarray(values, dtype=np.float32)[positions]
        return {"calls": [[1, 10], [1, 11]], "dtypes": ["float32"], "positions": [positions],
                "samples": [sampled.tobytes().hex()]}

    def case_with(reference):
        return SimpleNamespace(expected=[[Expected(np.asarray(reference, dtype=np.float64), ("float32",))]])

    assert np.count_nonzero(sparse_values[positions]) < REPEAT_MIN_NONZERO
    assert sparse_agreement(case_with(sparse_values), pair(sparse_values))
    assert not sparse_agreement(case_with(dense_values), pair(np.zeros(128)))
    assert not sparse_agreement(case_with(sparse_values), pair(dense_values))
    assert not sparse_agreement(SimpleNamespace(expected=[None]), pair(sparse_values))  # no reference kept: judged
