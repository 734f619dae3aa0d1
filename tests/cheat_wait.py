"""Cheat for the grader's tests: ops, but permute waits 2 ms each call (as a module that has another process
do its work and waits for the answer would): on the CPU the grader times by CPU time, and the wait must still
count."""
import time

import ops
from ops import *  # noqa: F401,F403


def permute(x, *dims):
    time.sleep(0.002)
    return ops.permute(x, *dims)
