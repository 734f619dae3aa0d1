"""The grader's parent process: makes each case's inputs, has a worker run and time the implementations, judges
the outputs the worker hands back against float64 references, survives hangs and crashes, grades.

The graded module runs only in the worker (``ops.scoring.worker``). The parent makes the inputs (fresh random
values every run; the check call's reproducible with ``--seed``), writes them as .npy files to a folder under
/dev/shm (or the system's temporary folder), and reads our outputs back from there: the verdict is computed
here, where nothing the graded module does can reach it.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import fresh, spare
from .grading import WRONG_FLAG, CaseResult, Timing, grade
from .judge import host_values, judge
from .spec import Case, Family

DEFAULT_TIMEOUT_S = 600.0  # per case: first-time kernel compiles and torch.compile are slow
DEFAULT_REFERENCE_TIMEOUT_S = 60.0
START_TIMEOUT_S = 300.0  # a worker imports jittor, ops and the graded module, and measures the copy bandwidth
# Cases whose inputs (as float64) are at most this time 3 sets of fresh values beside the check set; larger
# ones time the check set and one fresh set in turn: 2 sets to make and load instead of 3 (and as many outputs
# handed back: the check call's and one per timed set). On an H100 run (2026-11-27) loading the sets cost the
# worker 45 s and their preparations the parent 140 s, most of it on these cases. Two sets in turn still give
# every timed call a different buffer than the call before, and the fresh one fails a module that replays
# answers of a seeded run.
SMALL_CASE_BYTES = 64 << 20
PREPARE_THREADS = 3  # on a GPU host: the input sets of a case made (and their references computed) in parallel
# On a GPU host, cases prepared at once, and ahead of the one the worker runs. One at a time, 3 ahead, the
# parent's preparations (MaxPool3D's 1.1-1.6 s a case against the worker's 0.5) kept the worker waiting: an
# empty-cache H100 run's timing took 171 s for 115 s of the worker's own work over its first 110 cases; 2 at
# once and 6 ahead, 164 s for 126 s over 114 cases; a whole warm run with 2 at once, 6 ahead and 2 judges still
# had the worker wait 34 s for preparations (most on the largest cases, whose preparation takes longer than the
# 6 cases before them) and 15 s for judges (after the two 24300x11520 transpose_add cases, 7-10 s each) of its
# 185 s (2026-11-27): hence 3, 8 ahead and 3 judges. With PREPARE_THREADS threads each, the parent keeps up to 18
# threads of a 16-core host busy at its peaks; a timed window that another thread interrupted is slower, never
# faster, and the fastest window counts.
PREPARERS = 3
AHEAD = 8
JUDGES = 3  # on a GPU host: finished cases judged at once while the worker runs the next
# References computed in advance hold at most this much at once (one case ahead, one being judged): a host with
# 32 GB of memory still runs the largest cases, whose references the judge then computes set by set.
EAGER_REFERENCE_BYTES = 4 << 30
KILL_WAIT_S = 5.0
# After a signal, judges of cases measured before it get this long (an interrupted run must end within 10 s of
# the signal, its report written: the report takes ~1 s, a largest case's judge up to ~10 s on a GPU host).
INTERRUPT_JUDGE_S = 5.0
LOG_TAIL = 4000  # characters of a failing reference's compiler output kept in the JSON
SPARE_BYTES = 8 << 30  # at most (and at most 1/16 of the free memory): judged cases' files kept as spares


class Interrupted(Exception):
    """Raised by get_score.py's SIGTERM/SIGINT handler: stop, and report what has been measured so far."""


class _Timeout(Exception):
    pass


def _result_from_json(d: dict) -> CaseResult:
    d = dict(d)  # runs saved before a field existed lack it: its default applies
    known = {f.name for f in dataclasses.fields(Timing)}
    d["ours"] = Timing(**{k: v for k, v in d["ours"].items() if k in known})
    d["refs"] = {k: Timing(**{f: x for f, x in v.items() if f in known}) for k, v in d["refs"].items()}
    fields = {f.name for f in dataclasses.fields(CaseResult)}
    return CaseResult(**{k: v for k, v in d.items() if k in fields})


def scratch_root() -> str:
    """/dev/shm where it exists (the inputs and outputs never touch a disk), else the temporary folder."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ERROR_LINE = re.compile(r"\berror\b:? *(.*)")


def without_colors(text: str) -> str:
    return _ANSI.sub("", text)


def log_size(path: Optional[str]) -> int:
    """Bytes in the log file ``path`` (0 where there is none)."""
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def read_log(path: Optional[str], offset: int = 0) -> str:
    """The log file ``path`` from byte ``offset`` on ("" where there is none)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def error_lines(log: str) -> List[str]:
    """What follows ``error`` on each line of a compiler's (or CUDA's) output, colors removed, 160 characters
    at most."""
    return [without_colors(e).strip()[:160] for e in _ERROR_LINE.findall(log)]


def compile_reason(log: str) -> Optional[str]:
    """"compile failed: <the compiler's first error line>", or None when the log holds no error line."""
    first = error_lines(log)
    return f"compile failed: {first[0]}"[:160] if first else None


def compile_error(reason: str, log: Optional[str]) -> str:
    """A failed compile's one-line reason: the compiler's first error line rather than jittor's "Run cmd
    failed: <the whole command>"."""
    if not log or reason.startswith("compile failed") or not any(m in reason for m in ("Check failed", "Compile",
                                                                                       "compil")):
        return reason
    return compile_reason(log) or reason


def fresh_seed() -> int:
    """A seed no one can guess: a run's, unless --seed gives one."""
    return int(np.random.SeedSequence().entropy) % (1 << 63)


class ImplError(Exception):
    """The graded module does not import (the worker's one line says why): nothing can be graded."""


# The grader's own package root, first on a worker's sys.path: an ``ops.py`` or ``ops/`` in the working directory
# (which ``python -m`` would put first) does not replace the grader's package; the working directory comes next,
# for the graded module. Before anything is imported (``ops`` imports jittor, which may start a pool of compiler
# processes that a Landlocked process could no longer signal), the worker restricts itself
# (``isolation.worker_setup``, loaded by its path).
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOOT = ("import importlib.util, json, runpy, sys; root = sys.argv.pop(1); sys.path[0:1] = [root, '']; "
         "spec = importlib.util.spec_from_file_location('_grader_isolation', root + '/ops/scoring/isolation.py'); "
         "iso = importlib.util.module_from_spec(spec); spec.loader.exec_module(iso); "
         "why = iso.worker_setup(json.loads(sys.argv[sys.argv.index('--job') + 1]).get('isolation') or {}); "
         "why and print('isolation: ' + why, file=sys.stderr, flush=True); "
         "runpy.run_module('ops.scoring.worker', run_name='__main__', alter_sys=True)")


def worker_command(job: dict) -> List[str]:
    return [sys.executable, "-c", _BOOT, PACKAGE_ROOT, "--job", json.dumps(job)]


def _grader_nvcc_path() -> str:
    from .._jittor import jt
    return str(getattr(jt.flags, "nvcc_path", "") or "")


class Worker:
    """One grading worker process: JSON commands in, ``@@`` lines out, stderr to a log file; started as
    ``isolation`` (``ops.scoring.isolation.Isolation``) says, where one is given."""

    def __init__(self, *, device: str, impl: str, log_path: str, copy: bool, isolation=None):
        if threading.current_thread() is threading.main_thread():
            # jittor's core installs a SIGCHLD handler that exits this process when any child dies; a worker
            # killed for hanging, or one that crashed, must not take the grader down with it.
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        job = {"device": device, "impl": impl, "copy": copy, "log": log_path,
               "isolation": isolation.job() if isolation is not None else None}
        # One hash seed for every worker: a call's Python overhead (the plan caches' dict lookups, jittor's
        # keyword handling) depends on where string hashes put the keys, and a few-microsecond CPU case moved
        # across a tier boundary with it. Two CPU runs kept the points of 61-63 of the 65 base cases in 6 of 6
        # pairs with it pinned, 55-63 without (2-core machine, 2026-11-26).
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
        if device == "cpu":
            # Single-threaded CPU timing: the CPU cases are small, and with two thread pools (jittor's and
            # PyTorch's) or another busy process, one preempted thread stalls a whole parallel region; that
            # noise moved cases across tier boundaries from run to run.
            env.setdefault("OMP_NUM_THREADS", "1")
        nvcc = _grader_nvcc_path()
        if nvcc and "nvcc_path" not in env:
            # The worker's jittor is the grader's CUDA build, whatever the worker's own probe of the GPU says (a
            # worker that saw no GPU would build a CPU core into the same cache and break jittor's CUDA imports).
            env["nvcc_path"] = nvcc
        argv = worker_command(job)
        if isolation is not None:
            argv, env = isolation.command(argv), isolation.environment(env)
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1, env=env, start_new_session=True)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, cmd: dict) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def next(self, wait: float) -> Optional[Tuple[str, str]]:
        """The next protocol message (kind, payload); None when the worker exited; _Timeout after ``wait`` s.
        Lines that are not protocol (the graded module's prints) go to the log."""
        end = time.monotonic() + max(wait, 0.0)
        while True:
            try:
                line = self.lines.get(timeout=max(0.05, min(1.0, end - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= end:
                    raise _Timeout()
                continue
            if line is None:
                return None
            if line.startswith("@@"):
                kind, _, payload = line[2:].rstrip("\n").partition(" ")
                return kind, payload
            self.log.write(line.encode(errors="replace"))
            self.log.flush()

    def log_size(self) -> int:
        return log_size(self.log_path)

    def log_since(self, offset: int) -> str:
        return without_colors(read_log(self.log_path, offset))[-LOG_TAIL:]

    def exit_code(self) -> Optional[int]:
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """Kill the worker (and anything it started) and reap it, waiting at most KILL_WAIT_S: a process
        killed inside a GPU driver call can take a while to go, and the grader must not wait for it."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except OSError:
                self.proc.kill()
            try:
                self.proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        self.log.close()

    def close(self) -> None:
        """Let an idle worker exit (end of input), killing it if it does not."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.stop()


# --- inputs ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Prepared:
    """A case's input sets as the parent made them (set 0: the check call's), with what each must give."""

    folder: str
    sets: List[Tuple[List[np.ndarray], List[np.ndarray]]]  # (inputs, output gradients)
    expected: List[Optional[list]]  # per set: the family's Expected outputs (None: the judge computes them)
    timed: List[int]  # the sets the timed calls take in turn (``timed_sets``)
    seed: int = 0  # the case's seed: its timed calls' keys (``fresh.input_keys``) and the worker's draws
    seconds: float = 0.0  # making, writing and judging them in advance

    def call_inputs(self, fam: Family, case: Case, k: int, number: int):
        """(inputs, output gradients) of our timed call ``number`` on set ``k``: the set with the arrays each
        call varies (a forward's inputs, a backward's output gradients) as that call's copy flipped them."""
        arrays, grads = self.sets[k]
        varied = list(arrays if case.direction == "fwd" else grads)
        keys = fresh.input_keys(self.seed, 0, len(varied))
        varied = [fresh.flip_numpy(a, _case_dtype(case, a), key, number) for a, key in zip(varied, keys)]
        return (varied, list(grads)) if case.direction == "fwd" else (list(arrays), varied)


def timed_sets(fam: Family, case: Case) -> List[int]:
    """The input sets the timed calls take in turn (set 0 is the check set, from ``--seed``; the others fresh):
    [1, 2, 3], or [0, 1] for a case of more than SMALL_CASE_BYTES."""
    size = sum(int(np.prod(s)) for s in case.shapes) * 8
    return [1, 2, 3] if size <= SMALL_CASE_BYTES else [0, 1]


def input_sets(fam: Family, case: Case) -> int:
    """How many input sets a case has: the check set and the fresh ones."""
    return 1 + max(timed_sets(fam, case))


def _case_dtype(case: Case, a: np.ndarray) -> str:
    return case.dtype if a.dtype.kind == "f" else str(a.dtype)


def prepare_case(fam: Family, case: Case, folder: str, check_seed: Optional[int], fresh_seed: int,
                 threads: int = 1, spares: Optional[str] = None) -> Prepared:
    """Write the check set (from ``check_seed``; ``fresh_seed`` where that is None) and the timed sets (from
    ``fresh_seed``), and, with ``threads`` > 1, compute the check set's float64 references too (the timed calls'
    inputs are copies of the timed sets that only the calls checked are recomputed for, by the judge), unless
    they would hold more than EAGER_REFERENCE_BYTES. The files reuse the pages of spares from ``spares``
    (``ops.scoring.spare``)."""
    os.makedirs(folder, exist_ok=True)
    seeds = [check_seed if check_seed is not None else fresh_seed]
    seeds += [[fresh_seed, k] for k in range(1, input_sets(fam, case))]
    # float64 values and per-element bounds of every output; inputs stand in for outputs' sizes
    reference_bytes = 16 * sum(int(np.prod(s)) for s in case.shapes)
    eager = threads > 1 and reference_bytes <= EAGER_REFERENCE_BYTES

    def make(k):
        rng = np.random.default_rng(seeds[k])
        arrays = fam.make_inputs(case, rng)
        grads = fam.make_grads(case, rng) if case.direction == "bwd" else []
        entry = {"inputs": [], "grads": []}
        for role, group in (("inputs", arrays), ("grads", grads)):
            for i, a in enumerate(group):
                name = f"in{k}_{role}{i}.npy"
                spare.save(os.path.join(folder, name), a, spares)
                entry[role].append([name, _case_dtype(case, a)])
        # a family that computes blocks of rows is judged by them, in parallel: cheaper than whole references
        expected = _expected(fam, case, arrays, grads) if eager and k == 0 and \
            fam.expected_rows(case, arrays, grads) is None else None
        return entry, (arrays, grads), expected

    if threads > 1:
        with ThreadPoolExecutor(min(threads, len(seeds))) as pool:
            made = list(pool.map(make, range(len(seeds))))
    else:
        made = [make(k) for k in range(len(seeds))]
    timed = timed_sets(fam, case)
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump({"sets": [m[0] for m in made], "timed": timed}, f)
    return Prepared(folder, [m[1] for m in made], [m[2] for m in made], timed, seed=int(fresh_seed))


def _expected(fam: Family, case: Case, arrays, grads) -> list:
    return fam.expected(case, arrays, grads if case.direction == "bwd" else None)


# Bytes a judge of one set holds per input element (float64 reference values and bounds, the verdict's float64
# temporaries): what decides how many sets are judged at once.
JUDGE_BYTES_PER_ELEMENT = 48


def _available_memory() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def judge_threads(case: Case, groups: int, threads: int) -> int:
    """How many output groups to judge at once: up to ``threads``, as many as half the free memory holds."""
    per_group = JUDGE_BYTES_PER_ELEMENT * sum(int(np.prod(s)) for s in case.shapes)
    fits = _available_memory() // 2 // max(per_group, 1)
    return int(max(1, min(groups, threads, fits)))


# Elements per block of a judge by rows (its float64 temporaries: a few times 16 MB per thread).
ROW_BLOCK_ELEMENTS = 1 << 21


def case_footprint(fam: Family, case: Case) -> int:
    """Bytes the parent holds for a case from the start of its preparation to the end of its judge, at most:
    per set and input element its host array, its .npy file and our output's file (the dtype's host size,
    bfloat16 held as float32), and float64 references with their bounds, unless the case is judged in blocks
    of rows (``Family.judged_in_rows``): then only a block per judging thread. Counting whole references for
    those made the two 24300x11520 bfloat16 transpose_add cases (47 GB) run with nothing else in flight on an
    H100 host: the worker waited 25 s for their preparations and judges (2026-11-27)."""
    host = 4 if case.dtype == "bfloat16" else np.dtype(case.dtype).itemsize
    elements = sum(int(np.prod(s)) for s in case.shapes)
    sets = input_sets(fam, case)
    if fam.judged_in_rows(case):
        return 3 * host * elements * sets + PREPARE_THREADS * JUDGES * JUDGE_BYTES_PER_ELEMENT * ROW_BLOCK_ELEMENTS
    return (3 * host + 16) * elements * sets


def in_flight_limit() -> int:
    """Bytes of cases in flight (prepared ahead, or judged) at once on a GPU host: a third of the free memory
    (and at least 4 GB); a case larger than that runs with nothing else in flight."""
    return max(4 << 30, _available_memory() // 3)


def judge_by_rows(fam: Family, case: Case, arrays, grads, listed: list, folder: str,
                  threads: int) -> Optional[Tuple[bool, Optional[float], str]]:
    """The verdict on a single output judged in blocks of rows, ``threads`` blocks at a time (the float64
    references of the largest cases, whole, are gigabytes computed by one thread; in blocks they stay in the
    caches and every core works); None where the family does not compute blocks of rows."""
    rows = fam.expected_rows(case, arrays, grads) if len(listed) == 1 else None
    if rows is None:
        return None
    n, block = rows
    name, dtype = listed[0]
    got = np.load(os.path.join(folder, name), mmap_mode="r")
    if got.ndim == 0 or got.shape[0] != n:
        return False, None, f"shape {tuple(got.shape)}: expected {n} rows"
    step = max(1, ROW_BLOCK_ELEMENTS // max(1, int(np.prod(got.shape[1:]))))

    def one(start):
        return judge(host_values(np.asarray(got[start:start + step]), dtype), dtype, block(slice(start, start + step)),
                     origin=(start,))

    with ThreadPoolExecutor(max(1, threads)) as pool:
        verdicts = list(pool.map(one, range(0, n, step)))
    failing = [v for v in verdicts if not v[0]]
    if failing:
        ok, err, why = failing[0]
        more = f" (and {len(failing) - 1} more blocks of {step} rows fail)" if len(failing) > 1 else ""
        return False, err, why + more
    return True, max((v[1] or 0.0 for v in verdicts), default=0.0), ""


def judge_outputs(fam: Family, case: Case, prepared: Prepared, files: Dict[str, list], threads: int = 1,
                  checks: Optional[dict] = None) -> Tuple[bool, str, Optional[float], int]:
    """(correct, why, max error, outputs checked) over every output group the worker wrote: ``check`` (set 0, the
    checked call) and ``call<i>`` (a timed call: ``checks["calls"]`` gives its set and number, whose inputs the
    judge recomputes), then samples of drawn timed calls (``checks["samples"]``) and of pairs of timed calls whose
    samples agreed (``checks["repeats"]``), each on its calls' references. With
    ``threads`` > 1 the groups are judged that many at a time where memory allows (NumPy releases the GIL in its
    loops: the references the judge computes itself are most of its time); the verdict is that of the first
    failing group in this order either way."""
    if "check" not in files:
        return False, "no output of the checked call", None, 0
    checks = checks or {}
    calls = checks.get("calls", {})

    def inputs_of(tag):
        if tag == "check":
            return 0, prepared.sets[0], prepared.expected[0]
        k, number = calls[tag]
        return k, prepared.call_inputs(fam, case, k, number), None

    def where(tag):
        if tag == "check":
            return "checked call"
        k, number = calls[tag]
        return f"timed call {fresh.call_label(number)} on input set {k}"

    def judge_group(tag):
        """(ok, why, max error, outputs checked) of one group."""
        listed = files[tag]
        k, (arrays, grads), expected = inputs_of(tag)
        if expected is None:
            verdict = judge_by_rows(fam, case, arrays, grads, listed, prepared.folder, max(1, threads // at_once))
            if verdict is not None:
                ok, err, why = verdict
                if ok:
                    return True, "", err, 1
                return False, f"{where(tag)}, output 0: {why}", err, 1
            expected = _expected(fam, case, arrays, grads)
        if len(listed) != len(expected):
            return False, f"{where(tag)}: {len(listed)} outputs, expected {len(expected)}", None, 0
        worst, checked = 0.0, 0
        for i, ((name, dtype), exp) in enumerate(zip(listed, expected)):
            got = host_values(np.load(os.path.join(prepared.folder, name)), dtype)
            ok, err, why = judge(got, dtype, exp)
            checked += 1
            if not ok:
                return False, f"{where(tag)}, output {i}: {why}", err, checked
            if err is not None:
                worst = max(worst, err)
        return True, "", worst, checked

    tags = [t for t in files if t == "check" or t in calls]
    at_once = judge_threads(case, len(tags), threads)
    if at_once > 1:
        with ThreadPoolExecutor(at_once) as pool:
            verdicts = list(pool.map(judge_group, tags))
    else:
        verdicts = []
        for tag in tags:
            verdicts.append(judge_group(tag))
            if not verdicts[-1][0]:
                break
    worst, checked = 0.0, 0
    for ok, why, err, n in verdicts:
        checked += n
        if not ok:
            return False, why, err, checked
        worst = max(worst, err or 0.0)
    for entry in checks.get("samples", []) + checks.get("repeats", []):
        ok, why = judge_samples(fam, case, prepared, entry)
        if not ok:
            return False, why, None, checked + len(entry["calls"])
        checked += len(entry["calls"])
    return True, "", worst, checked


def judge_samples(fam: Family, case: Case, prepared: Prepared, entry: dict) -> Tuple[bool, str]:
    """Samples of the outputs of one timed call (a sampled call the worker drew) or of two (on different inputs,
    their samples bit for bit the same): right only where they are right for every listed call's inputs (an
    output of few distinct values may agree honestly). (ok, why)."""
    calls = entry["calls"]
    for k, number in reversed(calls):
        arrays, grads = prepared.call_inputs(fam, case, k, number)
        expected = _expected(fam, case, arrays, grads)
        for i, (dtype, positions, sample, exp) in enumerate(zip(entry["dtypes"], entry["positions"],
                                                               entry["samples"], expected)):
            got = host_values(np.frombuffer(bytes.fromhex(sample), _sample_dtype(dtype)), dtype)
            ok, _, why = judge(got, dtype, exp.take(np.asarray(positions, dtype=np.int64)))
            if ok:
                continue
            if len(calls) == 1:
                return False, f"timed call {fresh.call_label(number)} on input set {k}, output {i} (sampled): {why}"
            (k1, n1), (k2, n2) = calls
            return False, (f"timed calls {fresh.call_label(n1)} (set {k1}) and {fresh.call_label(n2)} (set {k2}) on "
                           f"different inputs gave the same samples of output {i}, wrong for call "
                           f"{fresh.call_label(number)}: {why}")
    return True, ""


def _sample_dtype(dtype: str):
    """The NumPy dtype the worker's samples of a ``dtype`` output are in (bfloat16: its bits)."""
    return np.uint16 if dtype == "bfloat16" else np.dtype("bool" if dtype == "bool" else dtype)


# --- running -----------------------------------------------------------------------------------------------

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
        self.env: dict = {}
        self.worker: Optional[Worker] = None
        self.start_failure: Optional[str] = None
        # Every input and draw of the run comes from this seed: the check sets from it, each case's timed sets,
        # its calls' keys and which calls are checked from it plus the case's index. Given (--seed), it
        # reproduces the run, recorded with it.
        self.seed = seed if seed is not None else fresh_seed()
        self.logs: List[str] = []
        # Judged cases' files kept for the next writers (ops.scoring.spare): at most this many bytes of memory
        self.spares, self.spare_bytes = os.path.join(scratch, "spare"), min(SPARE_BYTES, _available_memory() // 16)

    def _start(self) -> Worker:
        log = os.path.join(self.scratch, f"worker{len(self.logs)}.log")
        self.logs.append(log)
        w = Worker(device=self.device, impl=self.impl, log_path=log, copy=not self.env, isolation=self.isolation)
        try:
            msg = w.next(max(START_TIMEOUT_S, self.timeout_s))
        except _Timeout:
            w.stop()
            raise RuntimeError(f"the grading worker did not start within {max(START_TIMEOUT_S, self.timeout_s):.0f} s"
                               f"\n(importing jittor, ops and the graded module)")
        if msg is not None and msg[0] == "impl_error":
            w.stop()
            raise ImplError(msg[1])
        if msg is None or msg[0] != "env":
            code = w.exit_code()
            tail = w.log_since(0)[-1500:]
            w.stop()
            raise RuntimeError(f"the grading worker exited with code {code} before running a case\n{tail.strip()}")
        self.env.update(json.loads(msg[1]))  # a restarted worker does not measure the copy again
        self.on_ready()
        return w

    def _budget_left(self) -> float:
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
                                threads=PREPARE_THREADS if self.device == "cuda" else 1, spares=self.spares)
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

        def judge_check(check_files: list) -> None:
            """Where no reference is timed (stored tiers), a wrong checked call ends our rounds early: its case
            earns nothing whatever its time, and a class's wrong submissions cost their GPU less."""
            def run():
                try:
                    ok = judge_outputs(fam, case, prepared, {"check": check_files})[0]
                except Exception:
                    return
                if not ok:
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
                        fam, case, prepared, files, threads=PREPARE_THREADS if self.device == "cuda" else 1,
                        checks=checks)
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
            wait = min(limit - time.monotonic(), self._budget_left())
            try:
                msg = w.next(wait)
            except _Timeout:
                self.stop()
                if self._budget_left() <= 0:
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
                t = _result_from_json({"case_id": "", "nbytes": 0, "ours": d["timing"], "refs": {}}).ours
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
    ahead = ThreadPoolExecutor(PREPARERS) if overlap else None
    judging = ThreadPoolExecutor(JUDGES) if overlap else None
    upcoming: Deque[Tuple[int, Future, int]] = collections.deque()  # (index, prepared, footprint)
    judged: Deque[Tuple[Future, int]] = collections.deque()  # (finished result, footprint), oldest first
    limit = in_flight_limit()
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
        while queued < len(items) and len(upcoming) < AHEAD:
            footprint = case_footprint(*items[queued])
            if (upcoming or judged) and held + footprint > limit:
                return
            upcoming.append((queued, ahead.submit(runner.prepare, *items[queued], queued), footprint))
            held += footprint
            queued += 1

    try:
        for index, (fam, case) in enumerate(items):
            if runner._budget_left() <= 0:
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
            while len(judged) >= JUDGES:
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


def warm_compile(case_ids: Sequence[str], *, device: str, impl: str, budget_s: float, limit_bytes: int,
                 scratch: str, isolation=None, on_ready: Callable[[], None] = lambda: None) -> dict:
    """Compile every case's kernels before timing (``ops.scoring.compile_pass``), in one worker at a time: jittor
    compiles the new kernels of each batch of graphs in parallel, and no two processes race over jittor's
    generated files. Best effort within ``budget_s``: the worker is killed then, and timing compiles what is
    left. A worker that dies in a batch (a kernel that faults, say) costs that batch: a new worker goes on
    with the cases after it. Returns what was done: {"finished", "batches": [each batch's figures],
    "crashed": [case ids of batches whose worker died], "graphs", "seconds" or "skipped", "errors"}."""
    done: dict = {"finished": False, "batches": [], "crashed": []}
    deadline = time.monotonic() + budget_s
    remaining, attempt = list(case_ids), 0
    while remaining and time.monotonic() < deadline:
        w = Worker(device=device, impl=impl, log_path=os.path.join(scratch, f"warm{attempt}.log"), copy=False,
                   isolation=isolation)
        started_batch = 0  # cases of the batch being synced
        try:
            msg = w.next(max(0.0, deadline - time.monotonic()))
            if msg is not None and msg[0] == "impl_error":
                raise ImplError(msg[1])
            if msg is None or msg[0] != "env":
                return done
            on_ready()
            w.next(max(0.0, deadline - time.monotonic()))
            w.send({"warm": remaining, "limit_bytes": limit_bytes, "whole": attempt == 0})
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
        except _Timeout:
            return done
        finally:
            w.stop()
            done["errors"] = _first_errors(w.log_path, done.get("errors", []))
            attempt += 1
    return done


def _first_errors(log_path: str, known: List[str]) -> List[str]:
    """The compilers' and CUDA's first error lines in a worker's log, added to ``known`` (at most 5)."""
    try:
        with open(log_path, errors="replace") as f:
            found = error_lines(f.read())
    except OSError:
        found = []
    return list(dict.fromkeys(known + found))[:5]


def grade_all(results: List[CaseResult], stored: Optional[dict] = None,
              fallback_note: Optional[str] = None) -> List[CaseResult]:
    """Grade each result: against its stored tiers where ``stored`` has them, else this run's (noted with
    ``fallback_note`` when stored tiers were given but lack the case)."""
    for r in results:
        tiers = (stored or {}).get(r.case_id)
        if tiers is not None:
            grade(r, tiers, "stored")
        else:
            grade(r, None, fallback_note if stored is not None else None)
    return results
