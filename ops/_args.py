"""Argument checks shared by the operators: integers, reals and flags as Python, NumPy, PyTorch and jittor take
them, and jittor's limit on dimensions."""
from __future__ import annotations

import math
import numbers
import operator

import numpy as np

from ._jittor import jt

# jittor keeps shapes in a NanoVector of at most this many dims (nano_vector.h: "Check failed: s<10" past it).
MAX_DIMS = 10


def as_index(value, name: str) -> int:
    """``value`` as an int: whatever ``operator.index`` takes (int, NumPy integers, ...) but a bool, or a
    one-element integer jittor Var (as PyTorch takes a 0-d integer tensor). TypeError naming ``name`` otherwise
    (jittor's own ``__index__`` raises a RuntimeError for a Var of several elements, and truncates a float
    one)."""
    if isinstance(value, (bool, np.bool_)):
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


def is_sequence(value) -> bool:
    """A sequence of ints rather than one int: a tuple, list, range, jittor NanoVector, 1-D NumPy array or
    another iterable that is no int, string or Var (a one-element Var is an int to :func:`as_index`)."""
    if isinstance(value, (tuple, list, range, jt.NanoVector)):
        return True
    if isinstance(value, np.ndarray):
        return value.ndim == 1
    return (not isinstance(value, (jt.Var, str, bytes)) and not hasattr(value, "__index__")
            and hasattr(value, "__iter__"))


def as_index_sequence(value, name: str, positions: bool = True) -> tuple:
    """``value`` as a tuple of ints: a sequence of ints (tuple, list, range, a 1-D NumPy integer array, jittor's
    NanoVector, ...), each in any form :func:`as_index` takes. TypeError naming ``name`` (and, with
    ``positions``, the position: ``dims[1]``) otherwise."""
    if isinstance(value, (str, bytes, jt.Var)) or not (hasattr(value, "__iter__") or hasattr(value, "__getitem__")):
        raise TypeError(f"{name} must be a sequence of ints, got {type(value).__name__} ({value!r})")
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise TypeError(f"{name} must be a sequence of ints, got a {value.ndim}-D NumPy array")
        value = value.tolist()
    try:
        items = list(value)  # NanoVector iterates through __getitem__
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints, got {type(value).__name__}") from None
    return tuple(as_index(v, f"{name}[{i}]" if positions else name) for i, v in enumerate(items))


def as_real(value, name: str) -> float:
    """``value`` as a finite float: a real number (int, float, NumPy scalar or 0-d array) but a bool, or a
    one-element jittor Var. TypeError/ValueError naming ``name`` otherwise."""
    if isinstance(value, jt.Var):
        if value.numel() != 1 or str(value.dtype) == "bool":
            raise TypeError(f"{name} must be a real number, got a jittor Var of dtype {value.dtype} and shape "
                            f"{tuple(value.shape)}")
        value = value.item()
    elif isinstance(value, np.ndarray):
        if value.size != 1 or value.ndim > 1 or value.dtype.kind not in "iuf":
            raise TypeError(f"{name} must be a real number, got a NumPy array of dtype {value.dtype} and shape "
                            f"{value.shape}")
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r})")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value}")
    return out


def as_flag(value, name: str) -> bool:
    """``value`` as a bool: a bool, a NumPy bool, an int (nonzero is True) or None (False: jittor's default for
    ``return_indices``). TypeError naming ``name`` otherwise."""
    if value is None:
        return False
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    try:
        return operator.index(value) != 0
    except TypeError:
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})") from None


def check_rank(ndim: int, name: str) -> None:
    """ValueError naming ``name`` when a result would have more dims than a jittor Var can hold."""
    if ndim > MAX_DIMS:
        raise ValueError(f"{name} has {ndim} dims; jittor Vars have at most {MAX_DIMS}")
