"""The grader's pipeline, in the parent process: for each case, its inputs made (``prepare``), a worker to run and
time the implementations on them (``worker_proxy``), the outputs it hands back judged (``judging``), while the
next cases are prepared and the last ones judged as far as memory allows (``budget``); a hang or a crash fails
that case only.

The graded module runs only in the worker (``ops.scoring.worker``); the verdict is computed here, where nothing
the graded module does can reach it.
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

from . import budget, spare
from .args import DEFAULT_REFERENCE_TIMEOUT_S, DEFAULT_TIMEOUT_S
from .grading import WRONG_FLAG, CaseResult, Timing, result_from_json
from .judging import judge_outputs
from .logs import compile_error
from .prepare import Prepared, fresh_seed, prepare_case, scratch_root
from .spec import Case, Family
from .worker_proxy import DeviceError, ImplError, Worker, WorkerTimeout, check_start

START_TIMEOUT_S = 300.0  # a worker imports jittor, ops and the graded module, and measures the copy bandwidth
# After a signal, judges of cases measured before it get this long (an interrupted run must end within 10 s of
# the signal, its report written: the report takes ~1 s, a largest case's judge up to ~10 s on a GPU host).
INTERRUPT_JUDGE_S = 5.0


class Interrupted(Exception):
    """Raised by get_score.py's SIGTERM/SIGINT handler: stop, and report what has been measured so far."""


class Runner:
    """Runs cases one by one in a worker, restarting it after a hang or crash."""

    def __init__(self, *, device: str, impl: str, references: Sequence[str], timeout_s: float,
                 reference_timeout_s: float, repeats: int, seed: Optional[int], scratch: str,
                 stored_tiers: Optional[dict] = None, deadline: Optional[float] = None, isolation=None,
                 on_ready: Callable[[], None] = lambda: None):
        self.device, self.impl, self.references = device, impl, list(references)
        self.timeout_s, self.reference_timeout_s, self.repeats = timeout_s, reference_timeout_s, repeats
        self.scratch, self.stored, self.deadline = scratch, stored_tiers or {}, deadline
        self.isolation, self.on_ready = isolation, on_ready
        self.threads = budget.scaled(budget.PREPARE_THREADS) if device == "cuda" else 1  # per preparer and judge
        self.env: dict = {}
        self.worker: Optional[Worker] = None
        self.start_failure: Optional[str] = None
        # Every input and draw of the run comes from this seed: the check sets from it, each case's timed sets,
        # its calls' keys and which calls are checked from it plus the case's index. Given (--seed), it
        # reproduces the run, recorded with it.
        self.seed = seed if seed is not None else fresh_seed()
        self.logs: List[str] = []
        # Judged cases' files kept for the next writers (ops.scoring.spare): at most this many bytes of memory
        self.spares, self.spare_bytes = os.path.join(scratch, "spare"), budget.spare_limit()

    def _start(self) -> Worker:
        log = os.path.join(self.scratch, f"worker{len(self.logs)}.log")
        self.logs.append(log)
        w = Worker(device=self.device, impl=self.impl, log_path=log, copy=not self.env, isolation=self.isolation,
                   torch=any(r in ("torch", "compile") for r in self.references))
        try:
            msg = w.next(max(START_TIMEOUT_S, self.timeout_s))
        except WorkerTimeout:
            w.stop()
            raise RuntimeError(f"the grading worker did not start within {max(START_TIMEOUT_S, self.timeout_s):.0f} s"
                               f"\n(importing jittor, ops and the graded module)")
        try:
            check_start(msg)
        except (ImplError, DeviceError):
            w.stop()
            raise
        if msg is None or msg[0] != "env":
            code = w.exit_code()
            tail = w.log_since(0)[-1500:]
            w.stop()
            raise RuntimeError(f"the grading worker exited with code {code} before running a case\n{tail.strip()}")
        self.env.update(json.loads(msg[1]))  # a restarted worker does not measure the copy again
        self.on_ready()
        return w

    def budget_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None

    def recycle(self, folder: str) -> None:
        """A finished case's folder gone, its large files kept as spares for the next writers."""
        try:
            files = [e.path for e in os.scandir(folder) if e.name.endswith(".npy")]
        except OSError:
            files = []
        spare.keep(files, self.spares, self.spare_bytes)
        shutil.rmtree(folder, ignore_errors=True)

    def prepare(self, fam: Family, case: Case, index: int) -> Prepared:
        folder = os.path.join(self.scratch, f"case{index}")
        shutil.rmtree(folder, ignore_errors=True)
        started = time.monotonic()
        prepared = prepare_case(fam, case, folder, self.seed, self.seed + 1 + index,
                                threads=self.threads, spares=self.spares)
        prepared.seconds = time.monotonic() - started
        return prepared

    def run_case(self, fam: Family, case: Case, nbytes: int,
                 prepared: Prepared) -> Tuple[CaseResult, Callable[[], CaseResult]]:
        """Run the case in the worker. Returns the result so far and ``finish``, which judges the outputs,
        removes the case's folder and returns the finished result: the caller may finish a case while the
        worker runs the next one."""
        started = time.monotonic()
        result = CaseResult(case.id, nbytes, fam.flops(case))
        result.phases["prepare"] = round(prepared.seconds, 3)
        folder = prepared.folder
        skipped: Dict[str, Timing] = {}
        files: Optional[Dict[str, list]] = None
        checks: dict = {}
        early: List[threading.Thread] = []
        known: Dict[str, tuple] = {}  # the checked call's verdict where it was judged while the worker timed

        def judge_check(check_files: list) -> None:
            """Where no reference is timed (stored tiers), a wrong checked call ends our rounds early: its case
            earns nothing whatever its time, and a class's wrong submissions cost their GPU less."""
            def run():
                try:
                    known["check"] = judge_outputs(fam, case, prepared, {"check": check_files},
                                                   threads=self.threads)
                except Exception:
                    return
                if not known["check"][0]:
                    with open(os.path.join(folder, WRONG_FLAG), "w"):
                        pass
            early.append(threading.Thread(target=run, daemon=True))
            early[-1].start()

        def finish() -> CaseResult:
            for thread in early:
                thread.join()
            try:
                if files is not None:
                    judging = time.monotonic()  # the check call's references were computed in advance
                    result.correct, result.why, result.max_error, result.checked = judge_outputs(
                        fam, case, prepared, files, threads=self.threads,
                        checks=checks, known=known)
                    result.phases["judge"] = round(time.monotonic() - judging, 3)
                    if result.correct and not result.ours.ok:
                        result.correct, result.why = False, f"raised: {result.ours.error}"
                    elif result.correct and not checks.get("calls"):
                        result.correct, result.why = False, "no timed call's output came back to be checked"
                return result
            finally:
                self.recycle(folder)
                result.seconds = round(time.monotonic() - started, 2)

        while True:
            refs = [r for r in self.references if r not in skipped]
            outcome = self._attempt(case, folder, refs, nbytes, result, prepared.seed,
                                    judge_check if not refs and not early else None)
            kind = outcome[0]
            if kind == "reference hung":
                skipped[outcome[1]] = outcome[2]
                continue
            break
        if kind in ("hung", "crashed", "budget"):
            result.why = outcome[1]
            result.refs.update(skipped)
            return result, finish
        timings = outcome[2]
        result.ours = timings.pop("ours", Timing(error="no timing"))
        result.refs = {r: timings.get(r, skipped.get(r, Timing(error="no result"))) for r in self.references}
        if not result.ours.ok and "check" not in outcome[1]:
            result.why, result.refs = f"raised: {result.ours.error}", {}
            return result, finish
        files, checks = outcome[1], outcome[3]
        return result, finish

    def _attempt(self, case: Case, folder: str, refs: List[str], nbytes: int, result: CaseResult, seed: int,
                 on_check: Optional[Callable[[list], None]] = None):
        """Send the case to a worker and collect its messages (the variant it ran and each phase's seconds go
        to ``result``; the checked call's output files to ``on_check`` as they come).
        Returns ("ok", files, timings, checks), ("reference hung", name, Timing), ("hung"|"crashed"|"budget",
        why)."""
        if self.start_failure:
            return ("crashed", self.start_failure)
        if self.worker is None:
            try:
                self.worker = self._start()
            except RuntimeError as err:  # the graded module does not import, say: every case fails alike
                self.start_failure = f"crashed: {str(err).splitlines()[0]} ({str(err).splitlines()[-1][:200]})"
                return ("crashed", self.start_failure)
        w = self.worker
        stored = self.stored.get(case.id)
        w.send({"case": case.id, "dir": folder, "seed": seed, "spares": self.spares, "references": refs,
                "nbytes": nbytes, "tiers": stored, "repeats": self.repeats, "ours_is_ops": self.impl == "ops"})
        phases = result.phases
        files, timings, checks = {}, {}, {}
        phase, phase_start, log_mark = "start", time.monotonic(), w.log_size()
        case_start = time.monotonic()
        while True:
            if phase in refs:
                limit = phase_start + self.reference_timeout_s
            else:
                limit = case_start + self.timeout_s
            wait = min(limit - time.monotonic(), self.budget_left())
            try:
                msg = w.next(wait)
            except WorkerTimeout:
                self.stop()
                if self.budget_left() <= 0:
                    return ("budget", "not run: time budget spent")
                if phase in refs:
                    return ("reference hung", phase,
                            Timing(error=f"skipped: no result in {self.reference_timeout_s:.0f} s",
                                   log=w.log_since(log_mark) or None))
                return ("hung", f"hung: no result in {self.timeout_s:.0f} s (in {phase})")
            if msg is None:
                code = w.exit_code()
                self.stop()
                if phase in refs:
                    return ("reference hung", phase, Timing(error=f"crashed: worker exited with code {code}",
                                                            log=w.log_since(log_mark) or None))
                return ("crashed", f"crashed: worker exited with code {code}")
            kind, payload = msg
            if kind in ("phase", "done"):
                phases[phase] = round(phases.get(phase, 0.0) + time.monotonic() - phase_start, 3)
            if kind == "phase":
                phase, phase_start, log_mark = payload, time.monotonic(), w.log_size()
            elif kind == "variant":
                result.variant = payload
            elif kind == "outputs":
                written = json.loads(payload)
                files.update(written)
                if on_check is not None and "check" in written:
                    on_check(written["check"])
            elif kind == "checks":
                checks = json.loads(payload)
            elif kind == "timing":
                d = json.loads(payload)
                t = result_from_json({"case_id": "", "nbytes": 0, "ours": d["timing"], "refs": {}}).ours
                if t.error and d["name"] != "ours":
                    t.log = w.log_since(log_mark) or t.log
                    t.error = compile_error(t.error, t.log)
                timings[d["name"]] = t
            elif kind == "done":  # the worker's "@@ready" that follows is read (and ignored) with the next case
                return ("ok", files, timings, checks)


def run_cases(items: Sequence[Tuple[Family, Case]], *, device: str, impl: str, references: Sequence[str],
              seed: Optional[int], timeout_s: float = DEFAULT_TIMEOUT_S,
              reference_timeout_s: float = DEFAULT_REFERENCE_TIMEOUT_S, repeats: int = 5,
              stored_tiers: Optional[dict] = None, deadline: Optional[float] = None,
              nbytes_of: Optional[Callable[[str], int]] = None,
              on_result: Optional[Callable[[CaseResult], None]] = None, scratch: Optional[str] = None,
              overlap: Optional[bool] = None, isolation=None, on_ready: Callable[[], None] = lambda: None):
    """Run every case; returns (env, results in the given order). A hang or crash fails that case only.
    ``overlap`` (default: on a GPU): prepare and judge cases in the parent while the worker runs others.
    ``seed``: the run's seed (``Runner``; None: a fresh one); ``isolation``: how workers start
    (``ops.scoring.isolation.Isolation``); ``on_ready``: called when a worker has imported the graded module.
    :class:`ImplError` where the graded module does not import.

    ``deadline`` (a time.monotonic() value): the case running then is stopped and it and the rest are reported
    as not run. :class:`Interrupted` (a signal handler) ends the run the same way.
    """
    results: Dict[str, CaseResult] = {}
    own_scratch = scratch is None
    scratch = scratch or tempfile.mkdtemp(prefix="get_score-", dir=scratch_root())
    runner = Runner(device=device, impl=impl, references=references, timeout_s=timeout_s,
                    reference_timeout_s=reference_timeout_s, repeats=repeats, seed=seed, scratch=scratch,
                    stored_tiers=stored_tiers, deadline=deadline, isolation=isolation, on_ready=on_ready)

    def not_run(why):
        for fam, case in items:
            if case.id not in results:
                res = CaseResult(case.id, nbytes_of(case.id) if nbytes_of else fam.bytes_moved(case), why=why)
                results[case.id] = res
                if on_result:
                    on_result(res)

    # On a GPU the parent works beside the worker (the host has cores to spare): the next AHEAD cases' inputs
    # and references are made, PREPARERS at a time, and up to JUDGES finished cases judged, while the worker
    # runs this one, as far as memory allows; on the CPU that would slow the timed calls down, and each case
    # runs alone.
    overlap = device == "cuda" if overlap is None else overlap
    ahead = ThreadPoolExecutor(budget.scaled(budget.PREPARERS)) if overlap else None
    judges = budget.scaled(budget.JUDGES)
    judging = ThreadPoolExecutor(judges) if overlap else None
    upcoming: Deque[Tuple[int, Future, int]] = collections.deque()  # (index, prepared, footprint)
    judged: Deque[Tuple[Future, int]] = collections.deque()  # (finished result, footprint), oldest first
    limit = budget.in_flight_limit()
    held, queued = 0, 0  # bytes in flight; items handed to ``ahead``

    def record(res: CaseResult) -> None:
        results[res.case_id] = res
        if on_result:
            on_result(res)

    def settle(block: bool, wait: Optional[float] = None) -> None:
        """Record the judged cases: those done (``block``: the oldest too, waiting for it)."""
        nonlocal held
        while judged and (judged[0][0].done() or block):
            done, footprint = judged.popleft()
            held -= footprint
            block = False
            record(done.result(timeout=wait))

    def top_up() -> None:
        nonlocal held, queued
        while queued < len(items) and len(upcoming) < budget.AHEAD:
            footprint = budget.case_footprint(*items[queued])
            if (upcoming or judged) and held + footprint > limit:
                return
            upcoming.append((queued, ahead.submit(runner.prepare, *items[queued], queued), footprint))
            held += footprint
            queued += 1

    try:
        for index, (fam, case) in enumerate(items):
            if runner.budget_left() <= 0:
                break
            footprint, waiting = 0, time.monotonic()
            if ahead is None:
                prepared = runner.prepare(fam, case, index)
            else:
                top_up()
                while not upcoming:  # memory: wait for the oldest judge
                    settle(block=True)
                    top_up()
                _, pending, footprint = upcoming.popleft()
                prepared = pending.result()
                top_up()
            waited = time.monotonic() - waiting
            res, finish = runner.run_case(fam, case, nbytes_of(case.id) if nbytes_of else fam.bytes_moved(case),
                                          prepared)
            if res.why == "not run: time budget spent":
                finish()
                break
            if judging is None:
                record(finish())
                continue
            # What the worker sat idle for, beside the case's own phases: its preparation (and memory for it)
            # before the case, the oldest judges after it.
            res.phases["wait_prepare"] = round(waited, 3)
            settle(block=False)
            waiting = time.monotonic()
            while len(judged) >= judges:
                settle(block=True)
            res.phases["wait_judges"] = round(time.monotonic() - waiting, 3)
            judged.append((judging.submit(finish), footprint))
        while judged:
            settle(block=True)
        not_run("not run: time budget spent")
    except Interrupted as stop:
        runner.stop()
        try:
            stop_by = time.monotonic() + INTERRUPT_JUDGE_S  # cases measured before the signal: judged and kept
            while judged:
                settle(block=True, wait=max(0.0, stop_by - time.monotonic()))
        except Exception:
            pass
        not_run(f"not run: interrupted ({stop})")
    finally:
        for pool in (ahead, judging):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        if runner.worker is not None:
            runner.worker.close()
            runner.worker = None
        if own_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return runner.env, [results[c.id] for _, c in items]

