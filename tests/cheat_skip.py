"""Cheat for the grader's tests: ops, but it computes only some of its calls and answers the others with what it
has, per CHEAT_SKIP: "every2" (every other call of a function returns the previous call's output), "first8" (the
first 8 calls of a function compute, every later one returns the 8th's output), "empty" (after the first call,
every other call returns an output of the right shape and dtype that nobody wrote); calls counted per function,
input shapes and arguments. A call that computes costs 0.2 ms more (so that computing honestly earns nothing on
the CPU cases, whose references take 0.01-0.1 ms, while a round still makes dozens of calls)."""
import os

from cheat_util import call_key, spin, wrap_ops
from ops import *  # noqa: F401,F403
from ops._jittor import jt

_MODE = os.environ.get("CHEAT_SKIP", "every2")
_state = {}


def _skipping(name, fn):
    def wrapper(*args, **kwargs):
        key = call_key(name, args, kwargs)
        count, last = _state.get(key, (0, None))
        skip = last is not None and (
            (_MODE == "every2" and count % 2 == 1) or (_MODE == "first8" and count >= 8)
            or (_MODE == "empty" and count % 2 == 1))
        if skip and _MODE == "empty":
            outs = last if isinstance(last, tuple) else (last,)
            made = tuple(jt.empty(o.shape, o.dtype) for o in outs)
            out = made if isinstance(last, tuple) else made[0]
        elif skip:
            out = last
        else:
            spin(0.0002)
            out = fn(*args, **kwargs)
        _state[key] = (count + 1, out if not skip or _MODE != "empty" else last)
        return out
    return wrapper


globals().update(wrap_ops(_skipping))
