"""The grader's parent process: runs cases in worker subprocesses, survives hangs and crashes, grades."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from .grading import CaseResult, Timing, grade

DEFAULT_TIMEOUT_S = 600  # per case: first-time kernel compiles and torch.compile are slow


class Interrupted(Exception):
    """Raised by get_score.py's SIGTERM/SIGINT handler: stop, and report what has been measured so far."""


def _result_from_json(d: dict) -> CaseResult:
    d = dict(d)  # runs saved before a field existed lack it: its default applies
    d["ours"] = Timing(**d["ours"])
    d["refs"] = {k: Timing(**v) for k, v in d["refs"].items()}
    return CaseResult(**d)


def _stop(proc) -> None:
    """Kill a worker that is still running and reap it."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def _reader(stream, q):
    for line in stream:
        q.put(line)
    q.put(None)


def run_cases(case_ids: Sequence[str], *, device: str, impl: str, seed: int, references: Sequence[str],
              timeout_s: float = DEFAULT_TIMEOUT_S, on_result: Optional[Callable[[CaseResult], None]] = None,
              nbytes_of: Optional[Callable[[str], int]] = None, deadline: Optional[float] = None,
              repeats: int = 5):
    """Run every case; returns (env, results in case order). A hang or crash fails that case only.

    ``deadline`` (a time.monotonic() value): no case starts after it; the rest are reported as not run.
    :class:`Interrupted` raised while waiting (a signal handler) ends the run the same way: the worker is
    killed and the cases without a result are reported as not run.
    """
    pending = list(case_ids)
    results: Dict[str, CaseResult] = {}
    env: dict = {}

    def give_up_rest(why="not run: time budget spent"):
        for cid in pending:
            res = CaseResult(cid, nbytes_of(cid) if nbytes_of else 0, why=why)
            results[cid] = res
            if on_result:
                on_result(res)
        pending.clear()

    proc = None
    try:
        while pending:
            job = {"device": device, "impl": impl, "seed": seed, "cases": pending, "references": list(references),
                   "copy": not env, "repeats": repeats}
            proc = subprocess.Popen([sys.executable, "-m", "ops.scoring.worker", "--job", json.dumps(job)],
                                    stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"))
            lines: "queue.Queue[Optional[str]]" = queue.Queue()
            threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
            current, started, partial = None, time.monotonic(), None
            while True:
                wait = timeout_s - (time.monotonic() - started) if current else timeout_s * 2
                try:
                    line = lines.get(timeout=max(wait, 0.1))
                except queue.Empty:
                    line = "@@timeout"
                if line is None or line == "@@timeout":
                    if line == "@@timeout":
                        proc.kill()
                    code = proc.wait()
                    if not env and current is None:
                        raise RuntimeError(f"the grading worker exited with code {code} before running a case "
                                           f"(its error is printed above)")
                    failed = current or (pending[0] if pending else None)
                    if failed is not None:
                        why = (f"hung: no result in {timeout_s:.0f} s" if line == "@@timeout"
                               else f"crashed: worker exited with code {code}")
                        if partial is not None and partial.case_id == failed:
                            # ours finished; a reference hung or crashed: it fails, our verdict stands
                            res = partial
                            for name in references:
                                if name not in res.refs:
                                    res.refs[name] = Timing(error=why)
                                    break
                        else:
                            res = CaseResult(failed, nbytes_of(failed) if nbytes_of else 0, why=why)
                        results[failed] = res
                        if on_result:
                            on_result(res)
                        pending = [c for c in pending if c != failed]
                    break
                if not line.startswith("@@"):
                    sys.stderr.write(line)
                    continue
                kind, _, payload = line[2:].rstrip("\n").partition(" ")
                if kind == "env":
                    env.update(json.loads(payload))  # a restarted worker does not measure the copy again
                elif kind == "start":
                    if deadline is not None and time.monotonic() > deadline:
                        _stop(proc)
                        give_up_rest()
                        break
                    current, started = payload, time.monotonic()
                elif kind == "partial":
                    partial = _result_from_json(json.loads(payload))
                elif kind == "result":
                    res = _result_from_json(json.loads(payload))
                    results[res.case_id] = res
                    pending = [c for c in pending if c != res.case_id]
                    current = None
                    if on_result:
                        on_result(res)
            _stop(proc)
    except Interrupted as stop:
        _stop(proc)
        give_up_rest(f"not run: interrupted ({stop})")
    return env, [results[c] for c in case_ids]


def warm_compile(groups: Sequence[Sequence[str]], *, device: str, impl: str, seed: int,
                 timeout_s: float = 900) -> None:
    """Compile every case's kernels before timing: one worker per group (op family), all at once.

    jittor compiles a new kernel in 2-6 s of nvcc and, within one process, one sync at a time; the workers
    sync each family's graphs in two batches and run side by side (jittor's file lock off, since they
    compile different kernels), so the timed run finds every kernel in the cache.
    """
    env = dict(os.environ, disable_lock="1", PYTHONUNBUFFERED="1")
    procs = []
    for ids in groups:
        job = {"device": device, "impl": impl, "seed": seed, "cases": list(ids), "references": [], "warm": True}
        procs.append(subprocess.Popen([sys.executable, "-m", "ops.scoring.worker", "--job", json.dumps(job)],
                                      stdout=subprocess.DEVNULL, env=env))
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop(p)
    except Interrupted:
        for p in procs:
            _stop(p)
        raise


def grade_all(results: List[CaseResult], stored: Optional[dict] = None) -> List[CaseResult]:
    stored = stored or {}
    for r in results:
        grade(r, stored.get(r.case_id))
    return results
