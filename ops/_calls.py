"""The opening every public op shares: a recent call's plan found again, else the argument checks and a plan.

A family makes the opening of each public function once, at import: ``_open = opening1(_PLANS, _plan_of)`` (one
input Var), :func:`opening2` (two input Vars that both may need a gradient) or :func:`opening_shaped` (an input
Var and a Var that lends its shape only); the public function is one line, ``return _open(x, args)``. ``args``
is the call's other arguments as the user passed them (a tuple, or one value); ``build`` the family's planner,
``build(x, args, need_grad)`` or ``build(x, y, args, need_grad)``, which validates the call and returns its
plan; the plan is called on the input Vars.

The hit path (a call repeating a recent signature) is the opening's frame alone, in place of the separate
recent-call lookup each entry point used to call. Why the recent-call check comes before the key: see
:meth:`ops._launch.PlanCache.planned`.
"""
from __future__ import annotations

from . import _launch
from ._jittor import jt

__all__ = ["opening1", "opening2", "opening_shaped", "check_var", "reshape"]

_Var = jt.Var
_flags = _launch.flags
# jt.ops.reshape skips jt.Var.reshape's argument parsing (~1.4 us a call on the CPU runners).
reshape = jt.ops.reshape


def check_var(v, name: str) -> None:
    """TypeError naming ``name`` unless ``v`` is a jittor Var."""
    if not isinstance(v, _Var):
        raise TypeError(f"{name} must be a jittor Var, got {type(v).__name__}")


def opening1(plans: _launch.PlanCache, build):
    """The opening of an op on one input Var: ``open(x, args)`` returns the op's result; recent calls keyed by
    ``(x.numel(), args)``, their hit compared on x's shape, dtype, grad mode and device. (A closure: its cells
    are read faster than a module's globals or a PlanCache's attributes.)"""
    recent, flags, var = plans.recent, _flags, _Var  # planned is looked up per miss (tests patch it)

    def open1(x, args):
        if type(x) is var:
            try:
                hit = recent.get((x.numel(), args))
            except TypeError:  # a list or a Var among the arguments: no recent path
                hit = None
            if hit is not None:
                x_shape, x_dtype, need_grad, cuda, plan = hit
                if (x.shape == x_shape and x.dtype == x_dtype and flags.use_cuda == cuda
                        and (not (flags.no_grad or x.is_stop_grad())) is need_grad):
                    return plan(x)
        else:
            check_var(x, "x")
        need_grad, cuda = not (flags.no_grad or x.is_stop_grad()), flags.use_cuda
        key = (str(x.shape), str(x.dtype), args, need_grad, cuda)
        hit = (x.shape, x.dtype, need_grad, cuda)
        return plans.planned(key, (x.numel(), args), hit, build, x, args, need_grad)(x)

    return open1


def opening2(plans: _launch.PlanCache, build, names: tuple = ("x", "y")):
    """:func:`opening1` of an op on two input Vars, ``open(x, y, args)``, which needs a gradient unless both are
    stop_grad; recent calls keyed by ``(y.numel(), args)``, their hit compared on both Vars' shapes and dtypes.
    ``names``: the arguments' names for the TypeError of a non-Var."""
    recent, flags, var = plans.recent, _flags, _Var  # planned is looked up per miss (tests patch it)

    def open2(x, y, args):
        if type(x) is var and type(y) is var:
            try:
                hit = recent.get((y.numel(), args))
            except TypeError:
                hit = None
            if hit is not None:
                x_shape, x_dtype, y_shape, y_dtype, need_grad, cuda, plan = hit
                if (x.shape == x_shape and x.dtype == x_dtype and y.shape == y_shape and y.dtype == y_dtype
                        and flags.use_cuda == cuda
                        and (not (flags.no_grad or (x.is_stop_grad() and y.is_stop_grad()))) is need_grad):
                    return plan(x, y)
        else:
            check_var(x, names[0])
            check_var(y, names[1])
        need_grad = not (flags.no_grad or (x.is_stop_grad() and y.is_stop_grad()))
        cuda = flags.use_cuda
        key = (str(x.shape), str(x.dtype), str(y.shape), str(y.dtype), args, need_grad, cuda)
        hit = (x.shape, x.dtype, y.shape, y.dtype, need_grad, cuda)
        return plans.planned(key, (y.numel(), args), hit, build, x, y, args, need_grad)(x, y)

    return open2


def opening_shaped(plans: _launch.PlanCache, build):
    """:func:`opening1` of an op on ``x`` whose argument is ``other``'s shape, ``open(x, other)`` (``other``: a
    Var that lends its shape only, and no gradient); recent calls keyed by ``x.numel()``, their hit compared on
    other's shape list too (a key holding that shape as a tuple made expand_as 848 -> 1086 ns, 2-core CPU
    machine)."""
    recent, flags, var = plans.recent, _flags, _Var  # planned is looked up per miss (tests patch it)

    def open_shaped(x, other):
        if type(x) is var and type(other) is var:
            hit = recent.get(x.numel())
            if hit is not None:
                x_shape, x_dtype, other_shape, need_grad, cuda, plan = hit
                if (other.shape == other_shape and x.shape == x_shape and x.dtype == x_dtype
                        and flags.use_cuda == cuda and (not (flags.no_grad or x.is_stop_grad())) is need_grad):
                    return plan(x)
        else:
            check_var(x, "x")
            check_var(other, "other")
        need_grad, cuda = not (flags.no_grad or x.is_stop_grad()), flags.use_cuda
        key = (str(x.shape), str(x.dtype), str(other.shape), need_grad, cuda)
        return plans.planned(key, x.numel(), (x.shape, x.dtype, other.shape, need_grad, cuda), build, x, other,
                       need_grad)(x)

    return open_shaped
