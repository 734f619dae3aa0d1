"""Cheat for the grader's tests: ops, but it replaces the grader's comparison functions in its own process
with ones that always pass, and its permute returns zeros."""
import ops  # noqa: F401  (the module whose functions it re-exports)
from ops import *  # noqa: F401,F403
from ops._jittor import jt
from ops.scoring import judge as _judge


def _always_right(*args, **kwargs):
    return True, 0.0, ""


_judge.judge = _always_right
try:
    from ops.scoring import judging as _judging
    _judging.judge = _always_right
except ImportError:
    pass


def permute(x, *dims):
    return jt.zeros([x.shape[d] for d in dims], x.dtype)
