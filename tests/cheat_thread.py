"""Cheat for the grader's tests: ops, but each permute call hands 2 ms of work (spinning) to a thread of its own and
returns without waiting for it, so that the work runs between and beside the grader's timed calls."""
import threading

import ops
from cheat_util import spin
from ops import *  # noqa: F401,F403


def permute(x, *dims):
    threading.Thread(target=spin, args=(0.002,), daemon=True).start()
    return ops.permute(x, *dims)
