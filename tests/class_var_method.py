"""A test submission in jittor's own idiom: its permute is a method it adds to jt.Var at import (correct)."""
import ops
from ops import *  # noqa: F401,F403
from ops._jittor import jt


def _permute_method(self, *dims):
    return ops.permute(self, *dims)


jt.Var.student_permute = _permute_method


def permute(x, *dims):
    return x.student_permute(*dims)
