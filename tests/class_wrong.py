"""A class-grading test submission: ops, but permute and transpose_add add one to every output (wrong)."""
import ops
from ops import *  # noqa: F401,F403


def permute(x, *dims):
    return ops.permute(x, *dims) + 1


def transpose_add(x, y, dim0=0, dim1=1):
    return ops.transpose_add(x, y, dim0, dim1) + 1
