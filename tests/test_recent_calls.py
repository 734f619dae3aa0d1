"""The entry points' recent-call path (ops/_launch.py: PlanCache.planned): a repeated signature skips the key
and the dict, and nothing else does -- another shape, dtype, argument, grad mode or device of the same size gets
its own plan, and arguments that the full path rejects are still rejected after a call that planned."""

import numpy as np
import pytest

import ops
from ops import _launch
from ops import broadcast as broadcast_mod
from ops import permutation as permute_mod
from ops import pool3d as pool3d_mod
from ops import time_mix as timex_mod
from ops._jittor import jt



def _var(rng, shape, dtype="float32"):
    return jt.array(rng.standard_normal(shape).astype(dtype))


def _calls(rng):
    """(name, plan cache, call) of every entry point, each call on fresh Vars of one fixed signature."""
    x = rng.standard_normal((2, 3, 4)).astype("float32")
    y = rng.standard_normal((3, 2, 4)).astype("float32")
    v = rng.standard_normal((1, 2, 4, 4, 4)).astype("float32")
    w, k = rng.standard_normal((2, 5)).astype("float32"), rng.standard_normal((3, 2, 5)).astype("float32")
    return [
        ("permute", permute_mod._PERMUTE_PLANS, lambda: ops.permute(jt.array(x), 2, 0, 1)),
        ("transpose", permute_mod._TRANSPOSE_PLANS, lambda: ops.transpose(jt.array(x), 0, 2)),
        ("transpose_add", permute_mod._TRANSPOSE_ADD_PLANS,
         lambda: ops.transpose_add(jt.array(x), jt.array(y), 0, 1)),
        ("broadcast_to", broadcast_mod._PLANS_TO, lambda: ops.broadcast_to(jt.array(x[:1]), (5, 3, 4))),
        ("expand_as", broadcast_mod._PLANS_AS, lambda: ops.expand_as(jt.array(x[:1]), jt.zeros((5, 3, 4)))),
        ("max_pool3d", pool3d_mod._PLANS, lambda: ops.max_pool3d(jt.array(v), 2)),
        ("timex", timex_mod._PLANS, lambda: ops.timex(jt.array(w), jt.array(k), 0.5)),
    ]


@pytest.mark.parametrize("which", range(7))
def test_a_repeated_signature_takes_the_recent_path(device, rng, monkeypatch, which):
    """The second call of a signature returns the first's answer without reaching PlanCache.planned."""
    name, cache, call = _calls(rng)[which]
    first = call()
    first = first[0] if isinstance(first, tuple) else first
    assert len(cache.recent) == 1, name

    def no_planning(*args):
        raise AssertionError(f"{name}: a repeated signature was planned again")

    monkeypatch.setattr(cache, "planned", no_planning)
    again = call()
    again = again[0] if isinstance(again, tuple) else again
    np.testing.assert_array_equal(again.numpy(), first.numpy())


def test_signatures_of_one_size_alternate_correctly(device, rng):
    """Calls alternating between shapes, dtypes and dims of 24 elements each get their own plan: right values
    every time, and no plan made after the first round."""
    arrays = [rng.standard_normal(s).astype(d) for s, d in
              [((4, 6), "float32"), ((6, 4), "float32"), ((4, 6), "float16"), ((2, 3, 4), "float32")]]
    dims = [(1, 0), (1, 0), (1, 0), (2, 0, 1)]
    cache = permute_mod._PERMUTE_PLANS
    for round_ in range(3):
        if round_ == 1:
            built = cache.builds
        for a, d in zip(arrays, dims):
            out = ops.permute(jt.array(a), *d)
            assert str(out.dtype) == str(a.dtype)
            np.testing.assert_array_equal(out.numpy(), a.transpose(d))
        np.testing.assert_array_equal(ops.permute(jt.array(arrays[3]), 0, 2, 1).numpy(),
                                      arrays[3].transpose(0, 2, 1))
    assert cache.builds == built


def test_grad_mode_and_stop_grad_change_the_plan(device, rng):
    """A call under no_grad, then one that needs a gradient, then one on a stop_grad Var: the gradient is
    there exactly when it should be, with the right values."""
    a = rng.standard_normal((3, 1, 4)).astype("float32")
    g = rng.standard_normal((3, 5, 4)).astype("float32")
    with jt.no_grad():
        np.testing.assert_array_equal(ops.broadcast_to(jt.array(a), (3, 5, 4)).numpy(), np.broadcast_to(a, g.shape))
    for _ in range(2):
        x = jt.array(a)
        y = ops.broadcast_to(x, (3, 5, 4))
        dx = jt.grad((y * jt.array(g)).sum(), x)
        np.testing.assert_allclose(dx.numpy(), g.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)
    recent = broadcast_mod._PLANS_TO.recent[(a.size, (3, 5, 4))]
    assert recent[2] is True  # the last call needed a gradient
    x = jt.array(a).stop_grad()
    ops.broadcast_to(x, (3, 5, 4)).sync()
    assert broadcast_mod._PLANS_TO.recent[(a.size, (3, 5, 4))][2] is False


def test_list_arguments_are_not_remembered(device, rng):
    """A list may change after the call: a later call with the changed list gets the changed shape."""
    a = rng.standard_normal((1, 4)).astype("float32")
    shape = [3, 4]
    assert ops.broadcast_to(jt.array(a), shape).shape == [3, 4]
    shape[0] = 5
    np.testing.assert_array_equal(ops.broadcast_to(jt.array(a), shape).numpy(), np.broadcast_to(a, (5, 4)))
    dims = [1, 0]
    assert ops.permute(jt.array(a), dims).shape == [4, 1]
    assert all(type(key[1]) is not list for key in permute_mod._PERMUTE_PLANS.recent)


def test_bad_arguments_fail_after_a_good_call_of_the_same_values(device, rng):
    """Vars standing for ints (unhashable) never take the recent path, so the full path's checks still apply
    after a valid call with the same numbers."""
    x = jt.array(rng.standard_normal((2, 3, 4)).astype("float32"))
    ops.permute(x, 0, 1, 2)
    with pytest.raises(TypeError, match=r"dims\[1\] must be an int, got a jittor Var of dtype float32"):
        ops.permute(x, 0, jt.array(1.0), 2)
    ops.transpose(x, 0, 1)
    with pytest.raises(TypeError, match="dim0 must be an int, got a jittor Var"):
        ops.transpose(x, jt.array([0, 1]), 1)
    ops.broadcast_to(x, (4, 2, 3, 4))
    with pytest.raises(TypeError, match=r"shape\[1\] must be an int, got a jittor Var of dtype float32"):
        ops.broadcast_to(x, (4, jt.array(2.0), 3, 4))
    v = jt.array(rng.standard_normal((1, 1, 4, 4, 4)).astype("float32"))
    ops.max_pool3d(v, 2, padding=0)
    with pytest.raises(TypeError, match="padding must be an int, got a jittor Var of dtype float32"):
        ops.max_pool3d(v, 2, padding=jt.array(0.0))


def test_reload_switches_forgets_recent_calls(rng):
    ops.permute(jt.array(rng.standard_normal((2, 3)).astype("float32")), 1, 0)
    assert permute_mod._PERMUTE_PLANS.recent
    _launch.reload_switches()
    assert not permute_mod._PERMUTE_PLANS.recent and not permute_mod._PERMUTE_PLANS


def test_recent_calls_are_bounded():
    cache = _launch.PlanCache("recent-bound-test", maxsize=2)
    plans = [cache.planned(("k", i), ("r", i), ("sig",), lambda i=i: f"plan{i}") for i in range(3)]
    assert plans == ["plan0", "plan1", "plan2"]
    assert len(cache.recent) <= 2 and cache.recent[("r", 2)] == ("sig", "plan2")
    assert cache.planned(["k", 9], ["r", 9], ("sig",), lambda: "listed") == "listed"  # planned, not remembered
    assert ["r", 9] not in [list(r) for r in cache.recent]
