"""Cheat for the grader's tests: ops, but each call spins 2 ms on the CPU, and the module hides it from clocks
in its own process: time.perf_counter, time.process_time, time.monotonic and time.thread_time run 100 times
slow, resource.getrusage reports no CPU time, jt.sync_all, jt.sync, jt.Var.sync and jt.profile_scope do
nothing; and it slows jittor's reindex (the naive references' op) by 2 ms a call."""
import contextlib
import resource
import time

import ops
from cheat_util import spin
from ops import *  # noqa: F401,F403
from ops._jittor import jt

_real = {name: getattr(time, name) for name in ("perf_counter", "process_time", "monotonic", "thread_time")}
_origin = {name: clock() for name, clock in _real.items()}


def _slowed(name):
    return lambda: _origin[name] + (_real[name]() - _origin[name]) / 100.0


for _name in _real:
    setattr(time, _name, _slowed(_name))

_getrusage = resource.getrusage


class _NoTime:
    def __init__(self, usage):
        self._usage = usage

    def __getattr__(self, name):
        return 0.0 if name in ("ru_utime", "ru_stime") else getattr(self._usage, name)


resource.getrusage = lambda who: _NoTime(_getrusage(who))
jt.sync_all = lambda *args, **kwargs: None
jt.sync = lambda *args, **kwargs: None
jt.Var.sync = lambda self, *args, **kwargs: None
jt.profile_scope = lambda *args, **kwargs: contextlib.nullcontext([])
_reindex = jt.Var.reindex


def _slow_reindex(self, *args, **kwargs):
    spin(0.002)
    return _reindex(self, *args, **kwargs)


jt.Var.reindex = _slow_reindex


def _spinning(fn):
    def wrapper(*args, **kwargs):
        spin(0.002)
        return fn(*args, **kwargs)
    return wrapper


permute = _spinning(ops.permute)
max_pool3d = _spinning(ops.max_pool3d)
