"""The parent's side of the compile pass (``ops.scoring.compile_pass``, run in a worker before any case is timed):
starts the worker, hands it the case list, survives a worker that dies in a batch."""
from __future__ import annotations

import importlib.machinery
import json
import os
import sys
import time
from typing import Callable, List, Optional, Sequence

from .logs import error_lines
from .worker_proxy import PACKAGE_ROOT, Worker, WorkerTimeout, check_start


def compiled_before(case_ids: Sequence[str], impl: str, references: Optional[Sequence[str]],
                    device: str) -> bool:
    """Whether a finished pass built every case's graphs under the code the worker would import, found here
    without running it: a top-level module or package, looked up on the worker's path (the grader's package
    root, the working directory, then this interpreter's). A dotted name would run its parent package: the worker
    decides. Read without jittor (``compile_record.kernel_folder``). A wrong answer costs time only: timing rounds
    in which jittor compiled are run again."""
    if "." in impl:
        return False
    spec = importlib.machinery.PathFinder.find_spec(impl, [PACKAGE_ROOT, os.getcwd()] + sys.path[1:])
    if spec is None:
        return False
    from . import compile_record as record
    folder = record.kernel_folder(device)
    if folder is None:
        return False
    code = record.code_fingerprint(record.jittor_version(), impl, spec.origin if spec.has_location else "")
    return set(case_ids) <= record.compiled_cases(folder, code, record.pass_names(references))


def warm_compile(case_ids: Sequence[str], *, device: str, impl: str, budget_s: float, limit_bytes: int,
                 scratch: str, isolation=None, on_ready: Callable[[], None] = lambda: None,
                 references: Optional[Sequence[str]] = None) -> dict:
    """Compile every case's kernels before timing (``ops.scoring.compile_pass``), in one worker at a time: jittor
    compiles the new kernels of each batch of graphs in parallel, and no two processes race over jittor's
    generated files. Best effort within ``budget_s``: the worker is killed then, and timing compiles what is
    left. ``references``: the run's (None: all); the pass builds jittor's references only where the run times
    them. A worker that dies in a batch (a kernel that faults, say) costs that batch: a new worker goes on
    with the cases after it. Returns what was done: {"finished", "batches": [each batch's figures],
    "crashed": [case ids of batches whose worker died], "graphs", "seconds" or "skipped", "errors"}."""
    done: dict = {"finished": False, "batches": [], "crashed": []}
    if compiled_before(case_ids, impl, references, device):  # no worker to start (a jittor import: 6-7 s, H200)
        from .compile_record import COMPILED_FILE
        return dict(done, finished=True, graphs=0, skipped=f"compiled before ({COMPILED_FILE})", errors=[])
    deadline = time.monotonic() + budget_s
    remaining, attempt = list(case_ids), 0
    while remaining and time.monotonic() < deadline:
        w = Worker(device=device, impl=impl, log_path=os.path.join(scratch, f"warm{attempt}.log"), copy=False,
                   isolation=isolation)
        started_batch = 0  # cases of the batch being synced
        try:
            msg = w.next(max(0.0, deadline - time.monotonic()))
            check_start(msg)
            if msg is None or msg[0] != "env":
                return done
            on_ready()
            w.next(max(0.0, deadline - time.monotonic()))
            job = {"warm": remaining, "limit_bytes": limit_bytes, "whole": attempt == 0}
            if references is not None:
                job["references"] = list(references)
            w.send(job)
            while True:
                msg = w.next(max(0.0, deadline - time.monotonic()))
                if msg is None:  # died: skip the batch it was syncing, go on with the rest
                    lost = max(started_batch, 1)
                    done["crashed"].append(remaining[:lost])
                    remaining = remaining[lost:]
                    break
                kind, figures = msg[0], (json.loads(msg[1]) if msg[1] else {})
                if kind == "warmstart":
                    started_batch = figures["items"]
                elif kind == "warmbatch":
                    done["batches"].append(figures)
                    remaining, started_batch = remaining[figures["items"]:], 0
                elif kind == "warmed":
                    done.update(figures, finished=not done["crashed"])
                    return done
        except WorkerTimeout:
            return done
        finally:
            w.stop()
            done["errors"] = first_errors(w.log_path, done.get("errors", []))
            attempt += 1
    return done


def first_errors(log_path: str, known: List[str]) -> List[str]:
    """The compilers' and CUDA's first error lines in a worker's log, added to ``known`` (at most 5)."""
    try:
        with open(log_path, errors="replace") as f:
            found = error_lines(f.read())
    except OSError:
        found = []
    return list(dict.fromkeys(known + found))[:5]

