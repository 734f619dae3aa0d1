"""The parent's side of a grading worker: starts it (isolated, where asked), sends it JSON commands, reads its
``@@`` protocol lines, kills it when it hangs. The protocol is ``ops.scoring.worker``'s."""
from __future__ import annotations

import functools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import List, Optional, Tuple

from .logs import LOG_TAIL, log_size, read_log, without_colors

KILL_WAIT_S = 5.0


class WorkerTimeout(Exception):
    """No protocol message within the wait given to ``Worker.next``."""


class ImplError(Exception):
    """The graded module does not import (the worker's one line says why): nothing can be graded."""


class DeviceError(Exception):
    """The worker's jittor cannot run on the device asked for (--device cuda without CUDA): nothing can be graded."""


def check_start(msg) -> None:
    """A starting worker's first message: ImplError or DeviceError where it says it cannot grade."""
    if msg is not None and msg[0] == "impl_error":
        raise ImplError(msg[1])
    if msg is not None and msg[0] == "device_error":
        raise DeviceError(msg[1])


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


@functools.lru_cache(maxsize=None)
def _grader_nvcc_path() -> str:
    """The nvcc of the jittor build this machine's bootstrap makes, by its own probe (ops/_machine.py; "" where
    it finds no GPU: the CPU build). No jittor: the grader's process may not have imported it."""
    from .._machine import probe_machine
    machine = probe_machine(os.environ)
    return (machine.nvcc or "") if machine.gpu_count else ""


class Worker:
    """One grading worker process: JSON commands in, ``@@`` lines out, stderr to a log file; started as
    ``isolation`` (``ops.scoring.isolation.Isolation``) says, where one is given; with ``torch``, it imports
    PyTorch before the graded module and puts PyTorch back as it was before each reference is timed."""

    def __init__(self, *, device: str, impl: str, log_path: str, copy: bool, isolation=None, torch: bool = False):
        if threading.current_thread() is threading.main_thread():
            # jittor's core installs a SIGCHLD handler that exits this process when any child dies; a worker
            # killed for hanging, or one that crashed, must not take the grader down with it.
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        job = {"device": device, "impl": impl, "copy": copy, "log": log_path, "torch": torch,
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
        """The next protocol message (kind, payload); None when the worker exited; WorkerTimeout after ``wait`` s.
        Lines that are not protocol (the graded module's prints) go to the log."""
        end = time.monotonic() + max(wait, 0.0)
        while True:
            try:
                line = self.lines.get(timeout=max(0.05, min(1.0, end - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= end:
                    raise WorkerTimeout()
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
