"""Cheat for the grader's tests: ops, but at import it leaves a process behind (a double fork and setsid) that
waits for the grader to exit and then rewrites its reports (the --json and --markdown files named on the grader's
command line) and the stored tiers; it also tries to write them and a file among the grader's own at once."""
import os
import time

import ops
from ops import *  # noqa: F401,F403

MARK = "rewritten by cheat_detach"
GRADER_FILE = os.path.join(os.path.dirname(os.path.abspath(ops.__file__)), "scoring", "cheat_detach_was_here.txt")


def _grader():
    """(pid, report paths) of the get_score.py process above this one."""
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0") if a]
        if any(a.endswith("get_score.py") for a in argv):
            paths = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--json", "--markdown", "--save-tiers")]
            return pid, paths
        with open(f"/proc/{pid}/stat", "rb") as f:
            pid = int(f.read().rsplit(b")", 1)[1].split()[1])
    return None, []


def _rewrite(paths):
    for path in [GRADER_FILE] + paths:
        try:
            with open(path, "w") as f:
                f.write(MARK + "\n")
        except OSError:
            pass


def _leave_a_process():
    pid, paths = _grader()
    if pid is None or os.environ.get("CHEAT_DETACH_DONE"):
        return
    os.environ["CHEAT_DETACH_DONE"] = "1"  # once per run (the grader starts several workers)
    if os.fork() != 0:
        return
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    try:
        _rewrite(paths)
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)
        time.sleep(0.5)
        _rewrite(paths)
    finally:
        os._exit(0)


_leave_a_process()
