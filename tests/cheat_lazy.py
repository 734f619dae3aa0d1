"""Cheat for the grader's tests: ops, but a call returns memory nobody wrote (jt.empty, once a call of its shapes
has computed) and computes its answer only when the grader reads it: it replaces jt.Var.numpy, jt.Var.raw_ptr,
jt.Var.data and jt.Var.fetch_sync with versions that compute first. A call that computes costs 0.2 ms more, as
in cheat_skip, so that computing every call honestly earns nothing on the CPU cases."""
from cheat_util import call_key, spin, wrap_ops
from ops import *  # noqa: F401,F403
from ops._jittor import jt

_Var = jt.Var
_real = {name: _Var.__dict__[name] for name in ("numpy", "raw_ptr", "data", "fetch_sync")}
_pending = {}  # id of an unwritten output -> (the output, the call that computes it)
_computed = {}  # id of an unwritten output -> its real answer
_shapes = {}


def _answer(v):
    key = id(v)
    if key in _pending and _pending[key][0] is v:
        if key not in _computed:
            spin(0.0002)
            fn, args, kwargs, index = _pending[key][1]
            outs = fn(*args, **kwargs)
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            _computed[key] = outs[index]
            jt.sync([_computed[key]])
        return _computed[key]
    return v


def _method(name):
    real = _real[name]
    return lambda self, *a, **k: real(_answer(self), *a, **k)


def _getter(name):
    real = _real[name]
    return property(lambda self: real.__get__(_answer(self)))


_Var.numpy, _Var.fetch_sync = _method("numpy"), _method("fetch_sync")
_Var.raw_ptr, _Var.data = _getter("raw_ptr"), _getter("data")


def _lazy(name, fn):
    def wrapper(*args, **kwargs):
        key = call_key(name, args, kwargs)
        if key not in _shapes:
            spin(0.0002)
            out = fn(*args, **kwargs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            _shapes[key] = (isinstance(out, (tuple, list)), [(tuple(o.shape), str(o.dtype)) for o in outs])
            return out
        many, specs = _shapes[key]
        made = [jt.empty(shape, dtype) for shape, dtype in specs]
        for index, o in enumerate(made):
            _pending[id(o)] = (o, (fn, args, kwargs, index))
        return tuple(made) if many else made[0]
    return wrapper


globals().update(wrap_ops(_lazy))
