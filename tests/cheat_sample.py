"""Cheat for the grader's tests: ops, but every answer is remembered by a sample of 16 values of each input
(their bytes at fixed places), and a call whose inputs match a sample seen before returns that answer without
computing; a call that does compute costs 2 ms more (so that computing honestly earns nothing). With
CHEAT_SAMPLE_ABS=1 the sample is of the values' magnitudes: inputs that differ from a remembered set only in signs
match it."""
import os

import numpy as np

from cheat_util import spin, wrap_ops
from ops import *  # noqa: F401,F403

_ABS = os.environ.get("CHEAT_SAMPLE_ABS") == "1"
_memo = {}
hits = 0


def _sample(x) -> bytes:
    flat = x.reshape((x.numel(),))
    picks = np.linspace(0, x.numel() - 1, num=16).astype(np.int64)
    values = flat.numpy()[picks] if str(x.dtype) != "bfloat16" else flat.float32().numpy()[picks]
    if _ABS and values.dtype.kind in "fi":
        values = np.abs(values)
    return values.tobytes()


def _remembered(name, fn):
    def wrapper(*args, **kwargs):
        global hits
        key = (name, tuple(_sample(a) for a in args if hasattr(a, "numel")),
               tuple(a for a in args if not hasattr(a, "numel")), tuple(sorted(kwargs.items())))
        if key in _memo:
            hits += 1
            return _memo[key]
        spin(0.002)
        _memo[key] = fn(*args, **kwargs)
        return _memo[key]
    return wrapper


globals().update(wrap_ops(_remembered))
