"""The grader's watch over our timed calls (ops/scoring/harness.py:Watch): which calls go back whole."""
import numpy as np
import pytest

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



def test_agreeing_samples_of_a_sparse_gradient_are_judged_on_both_calls():
    """Two timed calls of a max_pool3d backward whose samples agree (mostly zeros: a sparse gradient's) are judged
    on both calls' references at those elements, computed there only (Family.expected_at): stale zeros fail, a
    call's own values pass for it and fail for another call."""
    from ops.scoring import prepare
    from ops.scoring.families import load_families
    from ops.scoring.fresh import call_number
    from ops.scoring.judging import judge_samples
    from ops.scoring.spec import Case, random_array
    rng = np.random.default_rng(11)
    (fam,) = load_families(["max_pool3d"])
    c = Case("max_pool3d", "t", "bwd", ((2, 4, 12, 12, 12),), "float32", (("kernel_size", 3), ("stride", 1)))
    x, dy = random_array((2, 4, 12, 12, 12), "float32", rng), random_array(fam.output_shapes(c)[0], "float32", rng)
    prepared = prepare.Prepared("", [([x], [dy])], [None], [0], seed=3)
    positions = rng.integers(0, x.size, size=64)
    first, second = call_number(0, 5), call_number(0, 6)

    def entry(values, calls):
        sampled = np.asarray(values, dtype=np.float32)
        return {"calls": [[0, n] for n in calls], "dtypes": ["float32"], "positions": [positions.tolist()],
                "samples": [sampled.tobytes().hex()]}

    own = fam.expected(c, *prepared.call_inputs(fam, c, 0, first))[0].value.reshape(-1)[positions]
    assert 0 < np.count_nonzero(own) < 32
    assert judge_samples(fam, c, prepared, entry(own, [first]))[0]
    assert not judge_samples(fam, c, prepared, entry(np.zeros(64), [first, second]))[0]
    ok, why = judge_samples(fam, c, prepared, entry(own, [first, second]))
    assert not ok and "gave the same samples" in why


class _Output:
    """A fake output whose live copies are counted (the memory the next call cannot reuse)."""

    live = 0
    shape, dtype = (4,), "float32"

    def __init__(self):
        _Output.live += 1

    def __del__(self):
        _Output.live -= 1

    def numel(self):
        return 4


class _Counting:
    """A non-jittor implementation (timed as PyTorch is) that records how many outputs are alive at each call."""

    on_gpu = False

    def __init__(self):
        self.alive = []

    def prepare(self, k):
        return None

    def call(self, k, prepared):
        self.alive.append(_Output.live)
        return [_Output()]

    def sync(self):
        pass


@pytest.mark.parametrize("cpu_clock", [False, True])
def test_a_reference_keeps_as_many_outputs_alive_as_ours(monkeypatch, cpu_clock):
    """Ours keeps outputs for its checks (on a GPU every output of a window, to sample it; one held call a window
    and the round's checked calls); a reference keeps the same ones and drops them where ours goes back, so that
    neither reuses memory the other cannot."""
    monkeypatch.setattr(H, "cpu_clock", lambda: cpu_clock)
    monkeypatch.setattr(H, "SAMPLED_MIN_CPU", 0)  # no looks: the fakes have no bytes to sample
    monkeypatch.setattr(H, "SAMPLED_EVERY_CPU", 10 ** 9)
    monkeypatch.setattr(H.Meter, "_sample_window", lambda self, kept: None)
    monkeypatch.setattr(H.Meter, "_count", lambda self: 64)  # the same windows for both
    alive = {}
    for name, save in (("ours", lambda tag, outs: [tag]), ("jittor", None)):
        impl = _Counting()
        meter = H.Meter(name, impl, timed=[0], watch=H.Watch(np.random.default_rng(5), save))
        meter.warm()
        impl.alive = []
        for _ in range(3):
            assert meter.round()
        alive[name] = impl.alive
    assert len(alive["ours"]) == len(alive["jittor"]) >= 3 * 64
    if cpu_clock:  # the call before, the held call of each window so far, the round's checked calls
        assert max(alive["ours"]) == max(alive["jittor"]) >= 2
    else:  # a window's every output
        assert max(alive["ours"]) == max(alive["jittor"]) >= 64 // H.WINDOWS
    assert abs(np.mean(alive["ours"]) - np.mean(alive["jittor"])) < 0.25 * np.mean(alive["ours"])


def test_a_reference_rations_its_kept_calls_as_ours_does():
    """A reference's watch follows ours' rationing (a PyTorch reference's outputs are not jittor Vars on the device
    and its inputs are not counted): where ours' outputs are large it keeps no checked call either, and where a
    call of ours is costly to judge it keeps one drawn call a case, not one a round."""
    outs = [jt.zeros((16,), "float32")]
    for large, cheap in ((True, False), (False, False), (False, True)):
        ours = H.Watch(np.random.default_rng(3), lambda tag, o: [tag])
        ours.prime(outs, on_device=False)
        ours.large, ours.sample_checked = large, cheap  # as a GPU case of that size would set them
        ref = H.Watch(np.random.default_rng(4), None, like=ours)
        ref.prime(outs, on_device=False)
        assert (ref.large, ref.sample_checked) == (large, cheap)
        kept = [len(ref.plan(40)) for _ in range(20)]
        if large:
            assert kept == [0] * 20
        elif cheap:
            assert kept == [H.CHECKS_PER_ROUND] * 20
        else:
            assert kept[0] == 1 and sum(kept) < 20  # reservoir draws over the case
