"""Cheat for the grader's tests: ops, but on import it sets a profile function (sys.setprofile) that acts only in
the naive reference's frames, to slow the reference its points are measured against: here it raises there, so
that the reference fails where the function reaches it. The grader puts the interpreter's hooks back before each
reference."""
import sys

from ops import *  # noqa: F401,F403


def _profile(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "naive_forward":
        raise RuntimeError("cheat_profile: the naive reference was sabotaged")


sys.setprofile(_profile)
