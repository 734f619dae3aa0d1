"""Cheat for the grader's tests: ops, but at import it leaves a process behind (a double fork and setsid) that
for a minute keeps rewriting the grader's reports (the --json, --markdown and --save-tiers files named on the
grader's command line where it can see it, and those in CHEAT_DETACH_PATHS, separated by os.pathsep) and a file
among the grader's own."""
import os
import time

import ops
from ops import *  # noqa: F401,F403

MARK = "rewritten by cheat_detach"
GRADER_FILE = os.path.join(os.path.dirname(os.path.abspath(ops.__file__)), "scoring", "cheat_detach_was_here.txt")


def _report_paths():
    """The report paths on the command line of the get_score.py process above this one (where this process
    can see it), and CHEAT_DETACH_PATHS."""
    paths = [p for p in os.environ.get("CHEAT_DETACH_PATHS", "").split(os.pathsep) if p]
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0") if a]
            with open(f"/proc/{pid}/stat", "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            break
        if len(argv) > 1 and os.path.basename(argv[1]) == "get_score.py":  # python get_score.py ...
            paths += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--json", "--markdown", "--save-tiers")]
            break
        pid = parent
    return paths


def _rewrite(paths):
    for path in [GRADER_FILE] + paths:
        try:
            with open(path, "w") as f:
                f.write(MARK + "\n")
        except OSError:
            pass


def _leave_a_process():
    paths = _report_paths()
    if os.fork() != 0:
        return
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            _rewrite(paths)
            time.sleep(0.05)
    finally:
        os._exit(0)


_leave_a_process()
