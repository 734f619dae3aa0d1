"""Argument checks shared by the operators: integers as Python, NumPy and PyTorch take them, and jittor's limit
on dimensions."""
from __future__ import annotations

import operator

from ._jittor import jt

# jittor keeps shapes in a NanoVector of at most this many dims (nano_vector.h: "Check failed: s<10" past it).
MAX_DIMS = 10


def as_index(value, name: str) -> int:
    """``value`` as an int: whatever ``operator.index`` takes (int, NumPy integers, ...) but a bool, or a
    one-element integer jittor Var (as PyTorch takes a 0-d integer tensor). TypeError naming ``name`` otherwise
    (jittor's own ``__index__`` raises a RuntimeError for a Var of several elements, and truncates a float
    one)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got a bool ({value!r})")
    if isinstance(value, jt.Var):
        dtype = str(value.dtype)
        if value.numel() == 1 and dtype.startswith(("int", "uint")):
            return int(value.item())
        raise TypeError(f"{name} must be an int, got a jittor Var of dtype {dtype} and shape {tuple(value.shape)}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})") from None


def check_rank(ndim: int, name: str) -> None:
    """ValueError naming ``name`` when a result would have more dims than a jittor Var can hold."""
    if ndim > MAX_DIMS:
        raise ValueError(f"{name} has {ndim} dims; jittor Vars have at most {MAX_DIMS}")
