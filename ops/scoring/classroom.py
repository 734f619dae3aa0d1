"""Grading a class: many ``--impl`` modules in one command, spread over the host's GPUs, one class report.

Each submission is graded by a run of the grader of its own (a child process: its own worker, isolation and
reports, exactly as ``get_score.py --impl M`` grades it alone), against one set of tiers: the file given with
``--tiers``, or tiers measured once at the start by grading ``ops`` with ``--save-tiers``. On a GPU host one child
runs per GPU (``CUDA_VISIBLE_DEVICES``), each taking the next submission when it finishes; on the CPU one after
another. A submission that crashes, hangs or fails its import costs itself only.

The class report: a CSV (``--csv``) with a row per submission (impl, points, max_points, correct, cases, seconds,
status) and a markdown table sorted by points with a column of points per family; every submission's own
markdown, JSON and log in ``--class-dir``. ``--shard I/N`` grades submissions I, I+N, I+2N, ... (0-based), so that
N machines share a class; ``--from-json`` of their JSON files makes one class report (refusing mixed tiers).

Nothing here imports jittor: the parent only schedules, reads the children's JSON and writes the report.
"""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .. import GRADER_PARENT
from .args import allowed_cpus, format_cpus, split_cpus
from .isolation import become_subreaper, descendants, reap

CSV_COLUMNS = ("impl", "points", "max_points", "correct", "cases", "seconds", "status")
STATUSES = ("ok", "wrong", "crashed", "import error", "timeout")
IMPORT_ERROR_EXIT = 2  # the grader's exit status for a usage error or an --impl it cannot import
TIERS_FILE = "tiers.json"
STOP_GRACE_S = 30.0  # a stopped child's time to write its partial report before SIGKILL
CLASS_PARENT = "OPS_GRADER_CLASS_PARENT"  # a child grader's environment: the class grader's pid, whose end stops it
CLASS_MARKDOWN = "class.md"
# The options of the class run that each child gets as they are (the rest: --impl, --tiers and the outputs are
# the child's own).
PASSED_ON = ("device", "op", "keyword", "direction", "references", "no_torch", "seed", "timeout",
             "reference_timeout", "repeats", "no_warm")


@dataclass
class Row:
    """One submission's line of the class report."""

    impl: str
    points: int = 0
    max_points: int = 0
    correct: int = 0
    cases: int = 0
    seconds: float = 0.0
    status: str = "crashed"
    families: Dict[str, int] = field(default_factory=dict)  # points per family
    why: str = ""  # the first reason a case failed, or why the run failed
    tiers: str = ""  # fingerprint of the tiers the points were measured against
    json_path: Optional[str] = None

    def csv_values(self) -> List[str]:
        return [self.impl, str(self.points), str(self.max_points), str(self.correct), str(self.cases),
                f"{self.seconds:.1f}", self.status]


def parse_shard(text: Optional[str]):
    """``I/N`` -> (I, N) with 0 <= I < N; None -> (0, 1). ValueError naming --shard otherwise."""
    if text is None:
        return 0, 1
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise ValueError(f"--shard must be I/N (this machine's index I of N, 0 <= I < N), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or index >= count:
        raise ValueError(f"--shard I/N needs N >= 1 and 0 <= I < N, got {text!r}")
    return index, count


def shard(impls: Sequence[str], index: int, count: int) -> List[str]:
    """Submissions index, index + count, ...: every machine of a job array gets a disjoint share."""
    return list(impls[index::count])


def parse_gpus(text: Optional[str], visible: int) -> List[int]:
    """``--gpus 0,1`` -> [0, 1]; None -> every GPU this host shows. ValueError naming --gpus otherwise."""
    if text is None:
        return list(range(visible))
    try:
        gpus = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--gpus must be GPU numbers separated by commas, got {text!r}") from None
    if not gpus or len(set(gpus)) != len(gpus) or any(g < 0 or g >= max(visible, 1) for g in gpus):
        raise ValueError(f"--gpus {text!r}: each GPU once, from 0 to {max(visible, 1) - 1}")
    return gpus


def tiers_fingerprint(data: dict) -> str:
    """What a JSON report's points were measured against: the stored tiers' file and content, or 'this run'."""
    meta = data.get("meta", {})
    tiers = meta.get("tiers", "this run")
    digest = meta.get("tiers_sha1")
    return f"{tiers} ({digest[:12]})" if digest else str(tiers)


def family_of(case_id: str) -> str:
    return case_id.split("/", 1)[0]


def row_from_json(impl: str, data: dict, seconds: float, json_path: Optional[str] = None) -> Row:
    """A submission's row from its grader JSON: ok where every case is correct, crashed where a case's worker
    died or hung, wrong otherwise."""
    results = data.get("results", [])
    row = Row(impl, seconds=seconds, json_path=json_path, tiers=tiers_fingerprint(data))
    row.cases = len(results)
    row.max_points = 100 * row.cases
    for r in results:
        row.points += int(r.get("points", 0))
        row.correct += bool(r.get("correct"))
        family = family_of(r["case_id"])
        row.families[family] = row.families.get(family, 0) + int(r.get("points", 0))
        if not r.get("correct") and not row.why:
            row.why = f"{r['case_id']}: {r.get('why', '')}"
    whys = [r.get("why", "") for r in results if not r.get("correct")]
    if not whys:
        row.status = "ok"
    elif any(w.startswith(("crashed", "hung", "raised")) for w in whys):  # its code died, hung or raised
        row.status = "crashed"
    else:
        row.status = "wrong"
    return row


def row_from_run(impl: str, returncode: Optional[int], json_path: str, log_path: str, seconds: float,
                 timed_out: bool) -> Row:
    """The row of a finished (or killed) child: its JSON where it wrote one, else what its exit says."""
    data = None
    if os.path.exists(json_path):
        try:
            with open(json_path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = None
    if data is not None and not timed_out:
        return row_from_json(impl, data, seconds, json_path)
    row = Row(impl, seconds=seconds, json_path=None)
    if timed_out:
        row.status, row.why = "timeout", f"not finished in {seconds:.0f} s (--submission-timeout)"
    elif returncode == IMPORT_ERROR_EXIT:
        row.status, row.why = "import error", _last_line(log_path)
    else:
        row.status, row.why = "crashed", f"exit status {returncode}: {_last_line(log_path)}"
    return row


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def safe_name(impl: str) -> str:
    """A file name for a submission's reports (module paths keep their dots)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", impl) or "impl"


def child_argv(args, impl: str, tiers: Optional[str], out_dir: str, save_tiers: Optional[str] = None,
               name: Optional[str] = None, cpus: Optional[Sequence[int]] = None) -> List[str]:
    """The grader command line of one submission (its reports named ``name``, default the module's; on ``cpus``
    where given)."""
    name = name or safe_name(impl)
    argv = [sys.executable, "-c", "import sys; from ops.scoring.cli import main; sys.exit(main(sys.argv[1:]))",
            "--impl", impl, "--json", os.path.join(out_dir, name + ".json"),
            "--markdown", os.path.join(out_dir, name + ".md"), "--no-progress"]
    if cpus:
        argv += ["--cpus", format_cpus(cpus)]
    if tiers and getattr(args, "references", None) is None:
        # the tiers grade every submission: timing the references again would double a child's time
        argv += ["--tiers", tiers, "--references", ""]
    elif tiers:
        argv += ["--tiers", tiers]
    if save_tiers:
        argv += ["--save-tiers", save_tiers]
    for key in PASSED_ON:
        value = getattr(args, key, None)
        flag = "-k" if key == "keyword" else "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            if key == "references":
                argv += [flag, ",".join(value)]
            else:
                for v in value:
                    argv += [flag, str(v)]
        else:
            argv += [flag, str(value)]
    return argv


class Grader:
    """Runs the children: one slot per GPU (or one on the CPU), each slot takes the next submission. With several
    slots each child runs on its slot's share of the host's cores (``split_cpus``): the parent's preparers and
    judges of one child do not preempt another child's timed calls. This process is the subreaper of the
    children's processes: what a child that was killed leaves behind (its workers, what they started) is killed
    as that child ends, and a child is sent SIGTERM when this process ends."""

    def __init__(self, args, out_dir: str, slots: Sequence[Optional[int]], submission_timeout: Optional[float],
                 on_row=None):
        self.args, self.out_dir, self.slots = args, out_dir, list(slots)
        self.cpu_shares = split_cpus(allowed_cpus(), len(self.slots)) if len(self.slots) > 1 else []
        self.timeout, self.on_row = submission_timeout, on_row
        self._lock = threading.Lock()
        self._running: Dict[int, subprocess.Popen] = {}
        self.stopped = False
        self.finished: Dict[int, Row] = {}  # submissions graded to the end (not stopped by stop_all), by position
        self.subreaper = become_subreaper()
        self.own = descendants(os.getpid())  # this process's own helpers, from before any child

    def _run(self, impl: str, gpu: Optional[int], tiers: Optional[str], save_tiers: Optional[str] = None,
             name: Optional[str] = None, timeout: Optional[float] = -1.0, index: Optional[int] = None) -> Row:
        name = name or safe_name(impl)
        json_path, log_path = os.path.join(self.out_dir, name + ".json"), os.path.join(self.out_dir, name + ".log")
        for stale in (json_path, os.path.join(self.out_dir, name + ".md")):
            if os.path.exists(stale):
                os.remove(stale)
        env = dict(os.environ)
        env[GRADER_PARENT] = "1"  # the child's own process imports no jittor (its workers do)
        env[CLASS_PARENT] = str(os.getpid())
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        started = time.monotonic()
        timed_out = False
        with open(log_path, "w") as log:
            cpus = None  # the tiers' run has the host to itself
            if self.cpu_shares and index is not None:
                cpus = self.cpu_shares[self.slots.index(gpu) % len(self.cpu_shares)]
            with self._lock:  # started and registered at once: a sweep never takes a new child for an orphan
                proc = subprocess.Popen(child_argv(self.args, impl, tiers, self.out_dir, save_tiers, name, cpus),
                                        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                self._running[proc.pid] = proc
                late = self.stopped  # started while stop_all ran: it did not see this child
            if late:
                self._stop_group([proc])
            try:
                proc.wait(timeout=self.timeout if timeout == -1.0 else timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                self._stop_group([proc])
            finally:
                with self._lock:
                    self._running.pop(proc.pid, None)
                    self.sweep()
        row = row_from_run(impl, proc.returncode, json_path, log_path, time.monotonic() - started, timed_out)
        with self._lock:
            if index is not None and not self.stopped:
                self.finished[index] = row
        if self.on_row and index is not None:
            self.on_row(row)
        return row

    @staticmethod
    def _stop_group(procs: Sequence[subprocess.Popen], grace: float = STOP_GRACE_S) -> None:
        """SIGTERM every child's session at once (each grader writes its partial report and exits), SIGKILL what
        is left after ``grace`` seconds."""
        import signal
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            for proc in procs:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            if all(proc.poll() is not None for proc in procs):
                return

    def sweep(self) -> int:
        """Kill every process below this one that no running child owns: the orphans of a child that ended (a
        child killed before it could stop its workers leaves them to this subreaper). Call with the lock held."""
        return reap(set(self.own) | set(self._running), timeout_s=5.0, collect_all=False)

    def stop_all(self) -> None:
        """No submission starts after this; the running ones are stopped together."""
        with self._lock:
            self.stopped = True
            running = list(self._running.values())
        self._stop_group(running)

    def measure_tiers(self, impl: str = "ops") -> Row:
        """Tiers measured once, on the first slot, by grading ``impl`` with --save-tiers."""
        return self._run(impl, self.slots[0], None, os.path.join(self.out_dir, TIERS_FILE), name="tiers-run",
                         timeout=None)  # the reference run is no submission: --submission-timeout is not for it

    def grade(self, impls: Sequence[str], tiers: Optional[str]) -> List[Row]:
        """Every submission, the slots taking them in turn; rows in the order of ``impls``."""
        queue = list(enumerate(impls))
        rows: Dict[int, Row] = {}
        lock = threading.Lock()

        def work(gpu):
            while True:
                with lock:
                    if not queue or self.stopped:
                        return
                    i, impl = queue.pop(0)
                rows[i] = self._run(impl, gpu, tiers, index=i)

        threads = [threading.Thread(target=work, args=(gpu,), daemon=True) for gpu in self.slots]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)
        return [rows[i] for i in range(len(impls)) if i in rows]


def rows_from_json_files(paths: Sequence[str]) -> List[Row]:
    """The class report of JSON files from earlier runs (one submission each, e.g. from several --shard
    machines). ValueError where they were graded against different tiers or on different devices, or where two
    files grade the same module."""
    rows, tiers, devices = [], set(), set()
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        impl = data.get("meta", {}).get("impl", os.path.splitext(os.path.basename(path))[0])
        row = row_from_json(impl, data, float(data.get("meta", {}).get("seconds") or 0.0), path)
        rows.append(row)
        tiers.add(row.tiers)
        devices.add(data.get("env", {}).get("name"))
    if len(tiers) > 1:
        raise ValueError("--from-json: the files were graded against different tiers (" + "; ".join(sorted(tiers))
                         + "): grade a class against one --tiers file")
    if len(devices) > 1:
        raise ValueError(f"--from-json: the files come from different devices ({', '.join(map(str, devices))})")
    seen = [r.impl for r in rows]
    twice = sorted({i for i in seen if seen.count(i) > 1})
    if twice:
        raise ValueError(f"--from-json: more than one file grades {', '.join(twice)}")
    return rows


def write_csv(path: str, rows: Sequence[Row]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            writer.writerow(row.csv_values())


def render_markdown(rows: Sequence[Row], title: str, notes: Sequence[str] = ()) -> str:
    """The class table: sorted by points (then name), a column of points per family, the status and why."""
    families = sorted({f for r in rows for f in r.families})
    ordered = sorted(rows, key=lambda r: (-r.points, -r.correct, r.impl))
    head = ["rank", "impl", "points", "of", "correct", "cases"] + families + ["seconds", "status", "why"]
    lines = [f"# {title}", ""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, r in enumerate(ordered, 1):
        cells = [str(rank), f"`{r.impl}`", str(r.points), str(r.max_points), str(r.correct), str(r.cases)]
        cells += [str(r.families.get(f, "-")) for f in families]
        cells += [f"{r.seconds:.0f}", r.status, r.why.replace("|", "/")[:160]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_terminal(rows: Sequence[Row], width: int = 120) -> str:
    """The class table on the terminal: rank, points, status, seconds and the impl, within ``width`` columns."""
    ordered = sorted(rows, key=lambda r: (-r.points, -r.correct, r.impl))
    lines = [f"{'rank':>4} {'points':>11} {'correct':>9} {'status':<12} {'s':>6}  impl"]
    for rank, r in enumerate(ordered, 1):
        line = (f"{rank:>4} {r.points:>5}/{r.max_points:<5} {r.correct:>4}/{r.cases:<4} {r.status:<12} "
                f"{r.seconds:>6.0f}  {r.impl}")
        lines.append(line[:width])
    return "\n".join(lines)
