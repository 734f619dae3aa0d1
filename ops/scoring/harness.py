"""The grading worker's side of one case: run each implementation on the inputs the parent made, hand the
outputs back, and time what a user pays.

Nothing here judges: the worker writes the outputs of our implementation as files and the parent compares them
with its float64 references (``ops.scoring.judge``).

Inputs: a check set (the first call's, before any timing; reproducible with ``--seed``) and the timed sets the
manifest names (three, or on large cases the check set and one more). Every timed call of a jittor implementation
(ours and the references alike) gets inputs no call has seen: a fresh copy of a timed set with about half of its
elements' bit patterns flipped by a hash of the call's number (``ops.scoring.fresh``), made on the device before
the clock starts, a batch of calls at a time. Of ours, a few timed calls' outputs go back to the parent whole
(which calls: drawn per round, not known before the round) and samples of the others are compared among the calls
of a window (``Watch``): a module that answers a call without computing it returns a wrong output there.

Three measures per implementation, measured in interleaved rounds (ours, then each reference, in every round,
so that a slow spell of the machine touches all of them alike); the fastest round counts, since other
processes only ever slow a round down:
* ``kernel_ms``: kernel time, jittor's profiler (it re-runs each kernel of the graph; no host work) or, for
  PyTorch on a GPU, CUDA events around back-to-back calls;
* ``wall_ms``: pipelined wall time per call: windows of back-to-back calls on fresh inputs (made before the
  window), each call's outputs synced without waiting for the device, the device waited for once at the end;
* ``call_ms``: wall time of one call synced to the device, as a training step pays it.
Points use ``ms = max(kernel_ms, wall_ms)``: work done outside jittor's kernels (on the host, in Python)
shows in the wall time, and launch overhead hidden by pipelining does not count against a fast kernel. On the
CPU device (one thread) a call runs in the calling thread: ``wall_ms`` is CPU time unless the call waited
(``_Span``), its windows' calls run in batches whose inputs are made off the clock, ``call_ms`` is the windows'
time per call, and ``ms = wall_ms``. A round in which jittor compiled a kernel (the compiler is a child process)
is discarded and run again. The clocks and syncs are bound at import, before the worker imports the graded
module.
Backward cases time only the backward: the forward outputs of each set are computed first, and the output
gradient is injected (``InjectGrad``) so that the op's own gradient code is all that runs.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import re
import resource
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._jittor import jt
from . import fresh, spare
from .grading import Timing
from .spec import Case, Family

TARGET_MS = 10.0  # each measurement runs the op about this long: 10 ms amortizes a ~5 us launch to 0.05%
# On the CPU clock, half that: a round's calls are planned by one synced call's wall time, which the inputs'
# reshape views inflated 1.5-2.5x while each timed call was a view of an input set (its second call 31 against 17 us
# for a 9 us max_pool3d, 2-core host); on fresh inputs it is nearly the call's own, and 5 ms keeps the rounds as
# long as they were.
TARGET_MS_CPU_CLOCK = 5.0
MAX_CALLS = 2048
MAX_RERUN = 256
# A call slower than this is timed by one call of its warm-up, not in rounds. On the H100 table (2026-11-26)
# every reference at 20 ms or more was at least 21x slower than ours, far from any tier boundary, and timing
# them in rounds (jittor's permutes of 50-100 ms a call, the naive timex) cost 36 s of a 170 s run.
SLOW_MS = 20.0
# A first call is never a measurement: besides loading kernels and making the first allocations (the naive 16 MB
# permute's: 22.6 ms, later calls ~0.03 ms; H100), it may wait on jittor's cache lock, which every process on the
# jittor install shares across cache names, while another compiles (a 0.05 ms jittor max_pool3d: 9.2 s; H200),
# or initialize PyTorch's autograd (its expand_as backward: 2.1 s against ~0.07 ms). The second calls of the five
# references that do take over 1 s a call (jittor's, 1.1-5.2 s) cost ~14 s of a warm H200 run.
WINDOWS = 4  # timed windows per round (see Meter.round)
NEAR_TIER = 0.06  # ours within this fraction of a tier's 0.95 boundary: more rounds (up to 3x)
# Ours this far (a fraction) from every tier's boundary after MIN_ROUNDS rounds: no more rounds, since the
# fastest of the rounds that remain could not move it across one (rounds of one case spread by a few percent).
# Two rounds, not three: 120 of 148 cases of an H100 run stopped early, their third rounds 14 s of its 254 s.
FAR_FROM_TIER = 0.2
MIN_ROUNDS = 2
WARM_CALLS = 5  # warm calls, at most, until one compiles nothing
# A round is run again (ROUND_ATTEMPTS tries in all) where something happened in it that its windows' times may
# not hold: a child process ran (jittor compiling a kernel, or the implementation's own), or on the CPU clock other
# threads of the worker used more than OTHER_THREADS_S of CPU (work moved to a thread of its own, done between the
# windows; jittor runs a CPU graph in the calling thread).
ROUND_ATTEMPTS = 4
OTHER_THREADS_S = 0.002
# Pipelined windows' fresh inputs and outputs (ours are kept to the window's end) hold at most this much: a round
# of a large case makes fewer calls (every implementation alike, 4 windows each) rather than tens of gigabytes of
# copies: 64 calls of a 256 MB permute (16 a window), 16 of the 24300x11520 transpose_add.
WINDOW_BYTES = 8 << 30


# The clocks and syncs timing uses, bound when the worker imports this module, before it imports the graded
# module: a module that replaces time.perf_counter, jt.sync_all and the like in its process does not reach them.
_perf_counter, _process_time, _thread_time = time.perf_counter, time.process_time, time.thread_time
_getrusage, _RUSAGE_THREAD, _RUSAGE_CHILDREN = resource.getrusage, resource.RUSAGE_THREAD, resource.RUSAGE_CHILDREN
_jt_sync, _jt_sync_all, _profile_scope = jt.sync, jt.sync_all, jt.profile_scope
# What the CPU clock's looks read ours' outputs through (mid-window, where putting everything back as it was
# costs too much: ``Pristine.reading`` there took 400 of 8300 CPU points): a module that replaces jt.Var.raw_ptr
# or NumPy's functions to compute an answer when it is read does not reach these.
_Var = jt.Var
_var_raw_ptr, _var_numel, _var_dtype = (jt.Var.__dict__[name] for name in ("raw_ptr", "numel", "dtype"))
_frombuffer, _c_uint8 = np.frombuffer, ctypes.c_uint8


def _voluntary_switches() -> int:
    """Times this thread gave up the CPU to wait (not counting preemption by other processes)."""
    return _getrusage(_RUSAGE_THREAD).ru_nvcsw


def _other_threads_cpu() -> float:
    """CPU seconds this process spent in threads other than this one."""
    return _process_time() - _thread_time()


def children_cpu_seconds() -> float:
    """CPU time of the processes below this one, finished and live: it grows when jittor compiles a kernel (the
    compiler is a child), or when the implementation ran a process of its own or has one work beside its calls."""
    used = _getrusage(_RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime + _live_descendants_cpu()


def _live_descendants_cpu() -> float:
    """CPU seconds the live processes below this one have run, found through /proc/<pid>/task/<tid>/children and
    counted per thread in nanoseconds (/proc/<pid>/task/<tid>/schedstat: a helper's few milliseconds beside a
    round show, where the 10 ms ticks of /proc/<pid>/stat missed them); 0 where the kernel lists no children.
    With jittor's 7 idle compile processes below a worker: 0.34 ms (0.72 through Python file objects)."""
    me = os.getpid()
    ns, todo, seen = 0, [me], set()
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            folder = f"/proc/{pid}/task/{tid}/"
            try:
                if pid != me:
                    ns += int(_read_proc(folder + "schedstat").split()[0])
                kids = [int(k) for k in _read_proc(folder + "children").split()]
            except (OSError, IndexError, ValueError):
                continue
            todo += [k for k in kids if k not in seen]
            seen.update(kids)
    return ns / 1e9


def _read_proc(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def cpu_clock() -> bool:
    """Time by this process's CPU time: on the CPU device with one thread (the grader's default there)."""
    return not jt.flags.use_cuda and os.environ.get("OMP_NUM_THREADS") == "1"


class InjectGrad(jt.Function):
    """``apply(y0, dy0, y1, dy1, ...)``: the root of a backward whose gradients reach each ``y`` as exactly its
    ``dy``. Its one output (``y0``'s clone, not computed) is the loss itself, not a sum of it: on the CPU jittor ran
    the sum of such a loss in every backward call (a reduce over ``y``, 5 of a tiny MaxPool3D backward's 40 us),
    which PyTorch's ``autograd.grad(ys, xs, dys)`` does not pay."""

    def execute(self, *pairs):
        self.dys = pairs[1::2]
        return pairs[0].clone()

    def grad(self, _):
        return tuple(g for dy in self.dys for g in (dy, None))


def _host_dtype(dtype: str) -> str:
    """The dtype a Var of ``dtype`` crosses to and from the host in: NumPy has no bfloat16, so float32 (which
    holds every bfloat16 exactly), made into bfloat16 on the device by a cast, a kernel of its own."""
    return "float32" if dtype == "bfloat16" else dtype


def _arrived(v, dtype: str):
    """``v``, of ``dtype``'s host dtype, as ``dtype``."""
    return v if _host_dtype(dtype) == dtype else v.astype(dtype)


def to_jittor(arr: np.ndarray, dtype: str):
    """A jittor Var of ``dtype`` holding ``arr`` exactly (jt.array alone narrows int64 and float64)."""
    host = _host_dtype(dtype)
    return _arrived(jt.array(arr.astype(host, copy=False) if host != dtype else arr, host), dtype)


# Inputs of this many bytes or more go from the mapped file straight into device memory: one host-to-device
# copy. jt.array first copies them into a pinned buffer of its own, and loading inputs took an H100 run 45 s
# (~1-2 GB/s, 2026-11-27).
DIRECT_UPLOAD_BYTES = 1 << 20
_direct_upload_works: Optional[bool] = None


def _memcpy(shape, dtype: str, inputs: list, source: str, kind: str, **data):
    """A new Var of ``shape`` and ``dtype`` holding ``out0->size`` bytes from ``source`` (a C++ pointer
    expression), copied by one memcpy when the graph runs: ``cudaMemcpyAsync`` of ``kind`` on jittor's stream on
    a GPU, ``std::memcpy`` on the host."""
    return jt.code(shape, dtype, inputs, cuda_src=f"cudaMemcpyAsync(out0_p, {source}, out0->size, {kind}, 0);",
                   cpu_src=f"std::memcpy(out0_p, {source}, out0->size);", cpu_header="#include <cstring>",
                   **({"data": data} if data else {}))


def upload(arr: np.ndarray, dtype: str):
    """A Var of ``dtype`` holding ``arr`` (C-contiguous, of ``dtype``'s host dtype), one memcpy from ``arr``'s
    memory when the graph runs: ``arr`` must live until then (a sync). One kernel per host dtype."""
    flat = _memcpy((arr.size,), _host_dtype(dtype), [], '(const void*)(size_t)data["addr"]', "cudaMemcpyHostToDevice",
                   addr=arr.ctypes.data)
    return _arrived(flat.reshape(tuple(arr.shape)), dtype)


def _probe(what: str, fallback: str, check) -> bool:
    """``check()``'s verdict, or False where it raises (the worker's log then says ``what`` failed and the
    ``fallback`` taken)."""
    try:
        return bool(check())
    except Exception as err:
        print(f"{what} failed ({short_error(err)}): {fallback}", file=sys.stderr)
        return False


def direct_upload_works() -> bool:
    """Does ``upload`` give back what it was given here (checked once a process, on 1 MB of distinct values)?
    Where it does not, inputs go through jt.array, and the worker's log says so."""
    global _direct_upload_works
    if _direct_upload_works is None:
        probe = np.arange(1 << 18, dtype=np.float32)
        _direct_upload_works = _probe("direct upload", "inputs go through jt.array",
                                      lambda: np.array_equal(upload(probe, "float32").numpy(), probe))
    return _direct_upload_works


def to_device(arr: np.ndarray, dtype: str):
    """``to_jittor``, by ``upload`` for a large C-contiguous array on a GPU (an input set's mapped files)."""
    if (jt.flags.use_cuda and arr.nbytes >= DIRECT_UPLOAD_BYTES and arr.flags.c_contiguous
            and arr.dtype == np.dtype(_host_dtype(dtype)) and direct_upload_works()):
        return upload(arr, dtype)
    return to_jittor(arr, dtype)


def for_host(v):
    """The Var that ``to_numpy`` reads for ``v``: ``v``, or its cast to the host dtype."""
    host = _host_dtype(str(v.dtype))
    return v if host == str(v.dtype) else v.astype(host)


def copy_bytes(x, dtype: str):
    """A new Var of ``dtype`` (of the same item size) holding ``x``'s bytes: a device or host memcpy."""
    return _memcpy(x.shape, dtype, [x], "in0_p", "cudaMemcpyDeviceToDevice")


_bits_work: Optional[bool] = None


def bfloat16_bits_work() -> bool:
    """Does the copy of a bfloat16 Var's bits give its values here (checked once a process on every bfloat16
    bit pattern)? Where it does not, bfloat16 outputs go back as float32 casts, and the worker's log says so."""
    global _bits_work
    if _bits_work is None:
        bits = np.arange(1 << 16, dtype=np.uint16)
        values = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
        numbers = ~np.isnan(values)  # (a cast into bfloat16 may make NaN payloads its own)

        def copies_bits():
            got = copy_bytes(to_jittor(values, "bfloat16"), "uint16").numpy()
            back = (got.astype(np.uint32) << np.uint32(16)).view(np.float32)
            return np.array_equal(got[numbers], bits[numbers]) and np.isnan(back[~numbers]).all()

        _bits_work = _probe("bfloat16 bit copy", "float32 casts instead", copies_bits)
    return _bits_work


def for_hand_back(v):
    """The Var the worker copies to the host to hand ``v`` back: ``v``, or for bfloat16 its bits as a flat
    uint16 Var (half the bytes of a float32 copy to move and write; one kernel for every shape), or its float32
    cast where that copy does not work."""
    if str(v.dtype) != "bfloat16":
        return v
    if not bfloat16_bits_work():
        return for_host(v)
    return copy_bytes(v.reshape((v.numel(),)), "uint16")


def hand_back_array(v) -> np.ndarray:
    """``v`` as the array the worker writes for the parent (bfloat16: uint16 bits, which ``judge.host_values``
    reads, or float32 values)."""
    h = for_hand_back(v)
    a = h.numpy()
    return a.reshape(tuple(v.shape)) if h is not v else a


def to_numpy64(v) -> np.ndarray:
    a = to_numpy(v)
    return a.astype(np.float64) if a.dtype.kind in "fc" else a


def to_numpy(v) -> np.ndarray:
    """The Var's values in its own NumPy dtype (bfloat16: float32, which holds each value exactly)."""
    return for_host(v).numpy()


_JITTOR_LOG_HEAD = re.compile(r"\[[iwef] \d{4} [\d:.]+ \d+ ([\w.]+:\d+)\]\s*")


def short_error(err: BaseException, limit: int = 160) -> str:
    """One line of an error, its cause first: for a jittor op that failed to run, the op's type and jittor's
    "[Reason]" (the rest of such a message is the op's source path, inputs and backtrace)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(err).__name__}: {err}").replace("\n", " ")
    if "[Reason]:" in text:
        op = re.search(r"\[OP TYPE\]:\s*(.*?)\s*\[(?:Input|Output|Async Backtrace|Reason)\]", text)
        reason = text.rsplit("[Reason]:", 1)[1]
        text = (f"{op.group(1)}: " if op else "") + reason
    else:
        for marker in ("Reason:", "Failed reason:"):
            if marker in text:
                text = text.split(marker, 1)[1].strip()
    text = _JITTOR_LOG_HEAD.sub(lambda m: f"{m.group(1)}: ", text)
    return re.sub(r"\s+", " ", text).strip()[:limit]


# --- input sets ----------------------------------------------------------------------------------------------

def load_sets(case_dir: str) -> dict:
    """The parent's manifest: {"sets": [{"inputs": [[file, dtype], ...], "grads": [...]}, ...], "timed": [the
    sets the timed calls take in turn]}; set 0 is the check set."""
    with open(os.path.join(case_dir, "manifest.json")) as f:
        return json.load(f)


class InputSet:
    """One set of inputs (and output gradients, for backward cases) as jittor Vars."""

    def __init__(self, arrays: Sequence[np.ndarray], dtypes: Sequence[str], grads=(), grad_dtype=None):
        self.arrays = list(arrays)  # kept: a Var ``upload`` made reads them when it runs
        self.xs = [to_device(a, d) for a, d in zip(arrays, dtypes)]
        self.grad_arrays = list(grads)
        self.dys = [to_device(g, grad_dtype) for g in grads]
        _jt_sync(self.xs + self.dys)

    @classmethod
    def placeholders(cls, arrays: Sequence[np.ndarray], dtypes: Sequence[str], grads=(),
                     grad_dtype=None) -> "InputSet":
        """Vars of the shapes of ``arrays`` and ``grads`` and the given dtypes, in uninitialized memory of the
        device (``jt.empty``, materialized by a sync, as timed inputs are): what the compile pass builds its
        graphs on. Values never change which kernels compile, and nothing is made on the host or copied
        (8 GB of zeros copied in took 20-35 s per compile batch on an H100 host). No host arrays: PyTorch
        cannot be run on it."""
        def empty(shape, dtype):  # made as to_jittor makes them: a host dtype's cast is a kernel to compile too
            return _arrived(jt.empty(tuple(shape), _host_dtype(dtype)), dtype)

        placeholder = cls.__new__(cls)
        placeholder.arrays, placeholder.grad_arrays = [], []
        placeholder.xs = [empty(a.shape, d) for a, d in zip(arrays, dtypes)]
        placeholder.dys = [empty(g.shape, grad_dtype) for g in grads]
        jt.sync(placeholder.xs + placeholder.dys)
        return placeholder

    @classmethod
    def from_files(cls, case_dir: str, entry: dict) -> "InputSet":
        """The set the parent wrote. Mapped, not read: the files are in memory already (/dev/shm), and a read
        into fresh memory pays a page fault per page (268 MB: 0.64 s loaded and 0.70 s into a Var, against
        0.14 s mapped, on a 2-core host); copy-on-write, so that PyTorch may take the arrays as they are."""
        def load(f):
            return np.load(os.path.join(case_dir, f), mmap_mode="c")
        arrays = [load(f) for f, _ in entry["inputs"]]
        grads = [load(f) for f, _ in entry.get("grads", [])]
        grad_dtype = entry["grads"][0][1] if entry.get("grads") else None
        return cls(arrays, [d for _, d in entry["inputs"]], grads, grad_dtype)


def input_dtypes(case: Case, arrays: Sequence[np.ndarray]) -> List[str]:
    return [case.dtype if a.dtype.kind == "f" else str(a.dtype) for a in arrays]


# --- graphs --------------------------------------------------------------------------------------------------

class JittorImpl:
    """An implementation in jittor (ours, the naive composite, jittor's built-in): builds the graph of one call
    on one input set, forward under no_grad (as PyTorch is timed: no autograd bookkeeping), or only the
    backward."""

    def __init__(self, case: Case, forward: Callable, sets: Sequence[InputSet]):
        self.case, self.forward, self.sets = case, forward, sets
        self._fwd_outs: Dict[int, list] = {}

    def _views(self, vs):
        return [v.reshape(v.shape) for v in vs]  # new Vars, same memory: nothing to recognize them by

    def stage(self, k: int) -> list:
        """A backward's forward on set ``k``, built and kept but not run: the Vars to sync (none for a
        forward case). The compile pass syncs many of these at once, so that jittor compiles them in parallel
        rather than one by one in ``prepare``."""
        if self.case.direction == "fwd" or k in self._fwd_outs:
            return []
        self._fwd_outs[k] = list(self.forward(self.case, self.sets[k].xs))
        return self._fwd_outs[k]

    def prepare(self, k: int):
        """Per-call inputs of set ``k``, made before any clock starts."""
        s = self.sets[k]
        if self.case.direction == "fwd":
            return self._views(s.xs)
        jt.sync(self.stage(k))
        return self._views(s.dys)

    def varied(self, k: int) -> list:
        """The Vars of set ``k`` that each timed call gets a fresh copy of: the inputs of a forward, the output
        gradients of a backward (its forward on the set's inputs is computed once, ``stage``)."""
        s = self.sets[k]
        return list(s.xs if self.case.direction == "fwd" else s.dys)

    def prepare_with(self, k: int, fresh: list):
        """A call's inputs on set ``k`` with ``fresh`` (Vars shaped as ``varied(k)``) in place of the varied ones."""
        if self.case.direction == "bwd":
            _jt_sync(self.stage(k))
        return list(fresh)

    def call(self, k: int, prepared) -> list:
        if self.case.direction == "fwd":
            with jt.no_grad():
                return list(self.forward(self.case, prepared))
        s = self.sets[k]
        root = InjectGrad.apply(*(v for pair in zip(self._fwd_outs[k], prepared) for v in pair))
        return list(jt.grad(root, [s.xs[i] for i in self.case.grad_of]))


class TorchImpl:
    """PyTorch eager (or torch.compile) on the same input sets."""

    def __init__(self, fam: Family, case: Case, sets: Sequence[InputSet], compiled: bool):
        import torch

        self.torch = torch
        self.case = case
        self.on_gpu = torch.cuda.is_available() and bool(jt.flags.use_cuda)
        device = "cuda" if self.on_gpu else "cpu"
        tdtype = getattr(torch, case.dtype)

        def tensor(a):
            t = torch.from_numpy(np.ascontiguousarray(a)).to(device)
            return t.to(tdtype) if t.is_floating_point() else t

        self.inputs = [[tensor(a) for a in s.arrays] for s in sets]
        if fam.torch_forward(case, self.inputs[0]) is None:
            raise RuntimeError("no PyTorch counterpart")

        def fn(*ts):
            return fam.torch_forward(case, list(ts))
        self.fn = torch.compile(fn, dynamic=False) if compiled else fn
        self.grads = []
        if case.direction == "bwd":
            for k, s in enumerate(sets):
                for i in case.grad_of:
                    self.inputs[k][i].requires_grad_()
                outs = list(self.fn(*self.inputs[k]))
                self.grads.append((outs, [tensor(g) for g in s.grad_arrays]))

    def prepare(self, k: int):
        return None

    def call(self, k: int, _prepared):
        torch = self.torch
        if self.case.direction == "fwd":
            with torch.no_grad():
                return self.fn(*self.inputs[k])
        outs, dys = self.grads[k]
        targets = [self.inputs[k][i] for i in self.case.grad_of]
        # Gradients are made dense, as ours are: PyTorch's permute backward returns a strided view of dy, which
        # would otherwise be timed as free and leave the copy to whoever uses the gradient.
        return [g.contiguous() for g in torch.autograd.grad(outs, targets, dys, retain_graph=True)]

    def sync(self):
        if self.on_gpu:
            self.torch.cuda.synchronize()


# --- timing --------------------------------------------------------------------------------------------------

def profile_kernels(impl: JittorImpl, k: int, rerun: int) -> float:
    """Kernel time in ms of one call on set ``k`` (jittor's profiler re-runs each kernel 2^j times)."""
    prepared = impl.prepare(k)
    _jt_sync_all(True)
    with _profile_scope(1, rerun) as report:
        _jt_sync(impl.call(k, prepared), device_sync=True)
    rows = report[1:]
    if not rows:
        return 0.0  # no kernel ran: all of the call's cost is in its wall time
    reps = min(int(float(r[2])) for r in rows)  # every kernel ran at least once per call
    return sum(float(r[3]) for r in rows) / reps / 1e6


class Graph:
    """``builder``'s graph as ``profile_kernels`` takes an implementation: nothing to prepare, a new graph a call."""

    def __init__(self, builder: Callable[[], list]):
        self.builder = builder

    def prepare(self, k):
        return None

    def call(self, k, _):
        return self.builder()


def _adds_seconds(method):
    """A Meter method whose wall time each call adds to ``self.seconds``."""
    @functools.wraps(method)
    def timed(self, *args):
        started = _perf_counter()
        try:
            return method(self, *args)
        finally:
            self.seconds += _perf_counter() - started
    return timed


# --- each call's inputs ------------------------------------------------------------------------------------------

class SetViews:
    """Each call's inputs: ``impl.prepare(k)`` of the set in turn (PyTorch, which is not graded, and test doubles)."""

    run = 1  # calls in a row on one set

    def __init__(self, impl):
        self.impl = impl
        self.call_bytes = 0

    def take(self, ks: Sequence[int]) -> list:
        """[(set, call number, prepared inputs)] for calls on the sets ``ks``, made and synced."""
        return [(k, None, self.impl.prepare(k)) for k in ks]

    def prime(self, k: int) -> None:
        pass


class FreshInputs:
    """Each call's inputs: fresh copies of the set's varied arrays (``JittorImpl.varied``), flipped by the call's
    number under this implementation's keys (``fresh``), MAX_COPIES calls of one set in a row from one launch."""

    run = fresh.MAX_COPIES

    def __init__(self, impl: "JittorImpl", keys: Sequence[Tuple[int, int]]):
        self.impl, self.keys = impl, list(keys)
        self.made: Dict[int, int] = {}  # calls made per set
        varied = impl.varied(0)
        self.call_bytes = sum(v.numel() * _itemsize(str(v.dtype)) for v in varied)

    def _copies(self, k: int, count: int) -> List[list]:
        """The varied Vars of ``count`` calls on set ``k`` (not synced)."""
        first = self.made.get(k, 0)
        self.made[k] = first + count
        per_array = []
        for a, v in enumerate(self.impl.varied(k)):
            copies, done = [], 0
            while done < count:
                step = fresh.MAX_COPIES if count - done >= fresh.MAX_COPIES else 1
                copies += fresh.fresh_copies(v, str(v.dtype), self.keys[a], fresh.call_number(k, first + done), step)
                done += step
            per_array.append(copies)
        return [[c[i] for c in per_array] for i in range(count)] if per_array else [[] for _ in range(count)]

    def take(self, ks: Sequence[int]) -> list:
        runs, start = [], 0
        for i in range(1, len(ks) + 1):
            if i == len(ks) or ks[i] != ks[start]:
                runs.append((ks[start], i - start))
                start = i
        taken = []
        for k, count in runs:
            first = self.made.get(k, 0)
            for i, varied in enumerate(self._copies(k, count)):
                taken.append((k, fresh.call_number(k, first + i), varied))
        _jt_sync([v for _, _, varied in taken for v in varied])
        return [(k, number, self.impl.prepare_with(k, varied)) for k, number, varied in taken]

    def prime(self, k: int) -> None:
        """Compile the launch of MAX_COPIES copies (its copies are not used: their numbers are skipped)."""
        _jt_sync([v for call in self._copies(k, fresh.MAX_COPIES) for v in call])


def _dtype_name(dtype) -> str:
    """A jittor or PyTorch dtype as jittor names it ("float32", not "torch.float32")."""
    name = str(dtype)
    return name[len("torch."):] if name.startswith("torch.") else name


def _itemsize(dtype) -> int:
    """Bytes of one element of a jittor or PyTorch dtype."""
    name = _dtype_name(dtype)
    return 2 if name == "bfloat16" else np.dtype(name).itemsize


# --- watching our outputs ----------------------------------------------------------------------------------------

CHECKS_PER_ROUND = 1  # timed calls per round whose outputs go back whole, drawn over the round
LARGE_OUTPUT_BYTES = 64 << 20
# Of the CPU's timed calls, about one in SAMPLED_EVERY_CPU (and at least SAMPLED_MIN_CPU a window) is looked at
# right after it returns (its output and the call's before it sampled), off the clock, for every implementation
# alike (the Python work between two calls slows the next one down a little: ours looked at one call in four and
# the references none took 7-14% longer a call than with none looked at, 2-core host). On a GPU every call's
# output is sampled after its window.
SAMPLED_EVERY_CPU = 8
SAMPLED_MIN_CPU = 2
MAX_REPEATS_REPORTED = 3  # pairs of calls with the same samples sent to the parent per case
# Sampled calls per round whose samples the parent judges on their call's reference, where a call's outputs hold at
# most SAMPLE_CHECK_BYTES (every CPU case; its reference takes ~1 ms): a module that answers some calls with
# memory it never wrote is found here (on a GPU every call is sampled, and compared with the case's earlier ones).
SAMPLE_CHECKS_PER_ROUND = 4
SAMPLE_CHECK_BYTES = 4 << 20


class Watch:
    """Our timed calls' outputs under watch, by draws the graded module cannot see coming. Whole outputs go back
    (``checks``: tag -> [set, call number]; ``files``: tag -> files) of a call drawn over each round (over the whole
    case where a call's reference is costly) and of a call drawn in our fastest window (the window that sets the
    time); samples of the others (``fresh.SAMPLES`` elements of each output at positions fixed for the case) are
    compared among the calls of a window: two calls on different inputs with the same samples (an answer handed
    out twice, or memory nobody wrote) go to the parent as ``repeats``, which judges the samples against both
    calls' references."""

    def __init__(self, rng: np.random.Generator, save: Optional[Callable[[str, list], list]],
                 like: Optional["Watch"] = None):
        """``save``: writes a checked call's outputs and returns their files; None for a reference, whose calls are
        looked at (and their samples dropped) and whose outputs are kept as ours are (checks and draws alike, the
        outputs dropped where ours go back), so that both are timed alike. ``like``: ours' watch, primed already,
        whose rationing a reference's follows (a PyTorch reference's outputs are not Vars on the device, nor are
        its inputs counted)."""
        self.rng, self.save, self.like = rng, save, like
        self.files: Dict[str, list] = {}
        self.checks: Dict[str, list] = {}
        self.repeats: List[dict] = []
        self.sampled_checks: List[dict] = []
        self.candidates: list = []  # this round's sampled calls: (call, samples, dtypes)
        self.positions: Optional[list] = None  # per output: (int32 positions, their Var on the device)
        self.seen: Dict[bytes, Tuple[int, int]] = {}
        self.samples = 0
        self.best = float("inf")  # our fastest window's ms per call so far
        self.large = False
        self.sample_checked = False  # a call's reference is cheap (SAMPLE_CHECK_BYTES): checks are not rationed
        self.timed_calls = 0  # of the case so far: a costly case's drawn check is one of them, uniformly
        self.drawn: Optional[tuple] = None  # that call (set, number, outputs), checked at the case's end
        self.fastest: Optional[tuple] = None  # the held call of our fastest window, checked at the case's end

    def prime(self, outs, on_device: bool, input_bytes: int = 0) -> None:
        """Sample positions for outputs shaped as ``outs`` (of calls on ``input_bytes`` of inputs), and
        (``on_device``: outputs sampled by a kernel, not read on the host) the sampling kernels compiled."""
        if self.positions is None:
            self.positions = []
            for o in outs:
                pos = fresh.sample_positions(tuple(o.shape), self.rng)
                self.positions.append((pos, jt.array(pos) if on_device else None))
            if self.like is not None:
                self.large, self.sample_checked = self.like.large, self.like.sample_checked
            else:
                size = sum(o.numel() * _itemsize(o.dtype) for o in outs)
                self.large = on_device and size > LARGE_OUTPUT_BYTES
                self.sample_checked = size + input_bytes <= SAMPLE_CHECK_BYTES
        if on_device and self.save is not None:
            for count in (1, fresh.MAX_COPIES):
                _jt_sync([fresh.sample_op([o] * count, var) for o, (_, var) in zip(outs, self.positions)])

    def plan(self, calls: int) -> set:
        """Positions of the round's calls whose outputs go back whole (none where our outputs are large: then every
        call is sampled on the device, and the parent's reference of one costs seconds). Where a call's
        reference is cheap, CHECKS_PER_ROUND of every round; else one call of the whole case, drawn uniformly
        (reservoir sampling over the rounds: this round's calls replace the one kept with the probability of
        their share of the case's calls so far)."""
        if self.large:
            return set()
        self.timed_calls += calls
        if not self.sample_checked and self.rng.random() >= calls / self.timed_calls:
            return set()
        return set(int(i) for i in self.rng.choice(calls, size=min(calls, CHECKS_PER_ROUND), replace=False))

    def looks(self, calls: int) -> set:
        """Positions (in a window of ``calls``) of the calls looked at on the CPU clock."""
        count = min(calls, max(SAMPLED_MIN_CPU, round(calls / SAMPLED_EVERY_CPU)))
        return set(int(i) for i in self.rng.choice(calls, size=count, replace=False))

    def held(self, calls: int) -> int:
        """The position (in a window of ``calls``) of the call whose output is kept to the window's end."""
        return int(self.rng.integers(calls))

    def round_done(self, per_window: List[float], held: list, checked: list) -> None:
        """The round's windows ended at ``per_window`` ms per call: the calls drawn for it (``checked``) go back
        whole (a costly case's is kept to the case's end instead), and where its fastest window is our fastest yet,
        that window's held call (``held``: one per window, as (set, call number, outputs)) is kept to the case's
        end. After the windows: a file written between two windows would slow the next one down."""
        for call in checked:
            if self.sample_checked:
                self.check(*call)
            else:
                self.drawn = call
        if self.sample_checked and self.candidates:  # samples the parent judges (on their call's reference)
            for i in self.rng.choice(len(self.candidates), size=min(SAMPLE_CHECKS_PER_ROUND, len(self.candidates)),
                                     replace=False):
                call, samples, dtypes = self.candidates[i]
                self.sampled_checks.append(self._entry([call], samples, dtypes=dtypes))
        self.candidates = []
        fastest = int(np.argmin(per_window))
        if per_window[fastest] < self.best and held[fastest] is not None:
            self.best = per_window[fastest]
            self.fastest = held[fastest]

    def finish(self) -> None:
        """The case's timing is over: the calls kept to its end go back whole (the fastest window's held call, and
        a costly case's drawn call). One check of the window that sets the time, not one per faster window: the
        parent's reference of a large case's call costs 0.5-2 s (three checks a case, not up to nine: judging
        took 264 s of the 148 H100 cases)."""
        for call in (self.fastest, self.drawn):
            if call is not None:
                self.check(*call)
        self.fastest = self.drawn = None

    def new_window(self) -> None:
        """(Samples are compared over the whole case: positions are fixed for it, and a module that hands out memory
        it never wrote hands out some earlier call's output.)"""

    def check(self, k: int, number: int, outs) -> None:
        if self.save is None:
            return
        tag = f"call{len(self.checks)}"
        self.files[tag] = self.save(tag, outs)
        self.checks[tag] = [k, number]

    def see(self, k: int, number: int, samples: List[bytes], outs) -> None:
        """One sampled call: ``samples``, the bytes of each output at the positions."""
        self.samples += 1
        if self.save is None:
            return
        key = b"".join(samples)
        before = self.seen.setdefault(key, (k, number))
        if before != (k, number) and len(self.repeats) < MAX_REPEATS_REPORTED:
            self.repeats.append(self._entry([before, (k, number)], samples, outs))
        if before == (k, number):
            self.candidates.append(((k, number), samples, [_dtype_name(o.dtype) for o in outs]))

    def _entry(self, calls, samples: List[bytes], outs=None, dtypes=None) -> dict:
        return {"calls": [list(c) for c in calls], "dtypes": dtypes or [_dtype_name(o.dtype) for o in outs],
                "positions": [pos.tolist() for pos, _ in self.positions], "samples": [s.hex() for s in samples]}

    def host_samples(self, outs) -> List[bytes]:
        """The samples of outputs in host memory (the CPU device), read where they lie (a jittor Var's memory, a
        PyTorch tensor's)."""
        found = []
        for o, (pos, _) in zip(outs, self.positions):
            if not isinstance(o, _Var):  # a PyTorch tensor, read as integers of its size (NumPy has no bfloat16)
                import torch
                bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[o.element_size()]
                found.append(o.detach().reshape(-1).view(bits).numpy()[pos].tobytes())
                continue
            size = _itemsize(str(_var_dtype.__get__(o)))
            raw = (_c_uint8 * (_var_numel(o) * size)).from_address(_var_raw_ptr.__get__(o))
            found.append(_frombuffer(raw, _SAMPLE_VIEW[size])[pos].tobytes())
        return found

    def device_samples(self, calls: List[list]) -> List[List[bytes]]:
        """The samples of each call's outputs (``calls``: each call's output Vars, on the device), a batch of
        MAX_COPIES calls at a time."""
        found: List[List[bytes]] = [[] for _ in calls]
        for j, (_, var) in enumerate(self.positions):
            start = 0
            while start < len(calls):
                step = fresh.MAX_COPIES if len(calls) - start >= fresh.MAX_COPIES else 1
                got = fresh.sample_op([c[j] for c in calls[start:start + step]], var).numpy()
                for i in range(step):
                    found[start + i].append(got[i].tobytes())
                start += step
        return found


_SAMPLE_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class _Span:
    """A stretch of a round on the clock: wall and CPU time, and whether the thread waited in it."""

    def __init__(self):
        self.wall, self.cpu, self.switches = _perf_counter(), _process_time(), _voluntary_switches()

    def ms(self, cpu_clock: bool) -> float:
        """Its time in ms: CPU time on the CPU clock unless the thread gave up the CPU to wait, else wall time."""
        wall, cpu = _perf_counter() - self.wall, _process_time() - self.cpu
        waited = _voluntary_switches() != self.switches
        return 1e3 * (cpu if cpu_clock and not waited else wall)


class Meter:
    """Times one implementation: warm calls, then one measurement per round on fresh inputs (``inputs``); with a
    ``watch`` (ours), its outputs are checked and sampled as it goes. A round in which jittor compiled a kernel
    (or anything else the windows' times miss happened: ``round``) is discarded and run again (``discarded``)."""

    def __init__(self, name: str, impl, timed: Sequence[int], inputs=None, watch: Optional[Watch] = None,
                 guard: Callable[[], None] = lambda: None, reading=contextlib.nullcontext):
        """``guard``: run before each measurement; ``reading``: a context for the watch's reads of the outputs
        (ours: ``Pristine.reading``, so that the module cannot compute an answer when it is read)."""
        self.name, self.impl, self.watch, self.guard, self.reading = name, impl, watch, guard, reading
        self.watching = watch is not None and watch.save is not None  # ours: outputs checked and compared
        # Every watched implementation keeps the outputs ours keeps, as long as ours keeps them: a kept output is
        # memory the next call cannot reuse (holding one output a window made a 914 KB CPU fill 1.09-1.11x slower a
        # call, ours and jittor's alike; 2-core host).
        self.holding = watch is not None
        self.inputs = inputs if inputs is not None else SetViews(impl)
        self.timed = list(timed)  # the input sets the timed calls take in turn
        self.cpu_clock = cpu_clock()
        self.is_jittor = isinstance(impl, JittorImpl)
        self.kernel: List[float] = []
        self.wall: List[float] = []
        self.per_call: List[float] = []
        self.calls = 0
        self.estimate_ms = None
        self.slow = False
        self.unclean = False  # no warm call ran without a compile
        self.discarded = 0
        self.turn = 0
        self.output_bytes = 0
        self.seconds = 0.0  # spent in warm() and round()

    def _sync(self, outs, device: bool):
        if self.is_jittor:
            _jt_sync(outs, device_sync=device)
        elif device:
            self.impl.sync()

    def _idle(self) -> None:
        """Wait until the device has nothing queued, so that a measurement starts clean."""
        if self.is_jittor:
            _jt_sync_all(True)
        else:
            self.impl.sync()

    def _sets(self, n: int) -> List[int]:
        """The sets of the next ``n`` calls: ``inputs.run`` calls on a set, then the next set."""
        ks = []
        for _ in range(n):
            ks.append(self.timed[(self.turn // self.inputs.run) % len(self.timed)])
            self.turn += 1
        return ks

    @_adds_seconds
    def warm(self) -> None:
        """Compile and run until a call after the first compiled nothing; that call's synced wall time is the
        estimate that plans the rounds. A slow implementation's estimate is its measurement, and rounds leave it
        out (one call of jittor's timex reference costs up to 5.2 s on an H200)."""
        self.guard()
        for attempt in range(WARM_CALLS):
            [(k, number, prepared)] = self.inputs.take(self._sets(1))
            if attempt == 0:
                self.inputs.prime(k)
            self._idle()  # (the copies may still run on the device)
            children = children_cpu_seconds()
            started = _perf_counter()
            outs = self.impl.call(k, prepared)
            self._sync(outs, True)
            self.estimate_ms = (_perf_counter() - started) * 1e3
            clean = children_cpu_seconds() == children
            if self.watch is not None:
                self.watch.prime(outs, self.is_jittor and not self.cpu_clock, self.inputs.call_bytes)
            self.output_bytes = sum(o.numel() * _itemsize(o.dtype) for o in outs)
            if clean and attempt > 0:
                break
            del outs, prepared
        else:
            self.unclean = True
            return
        self.slow = self.estimate_ms > SLOW_MS
        if self.slow:
            if self.watching:  # the call that is the measurement is checked
                self.watch.check(k, number, outs)
            self.calls += 1
            for figures in (self.wall, self.per_call, self.kernel):
                figures.append(self.estimate_ms)

    def _count(self) -> int:
        target = TARGET_MS_CPU_CLOCK if self.cpu_clock else TARGET_MS
        n = int(max(2, min(MAX_CALLS, target / max(self.estimate_ms, 1e-3))))
        per_call = self.inputs.call_bytes + self.output_bytes
        if per_call and not self.cpu_clock:  # (the CPU clock's windows hold a run's inputs at a time)
            n = min(n, WINDOWS * max(1, WINDOW_BYTES // per_call))
        return n

    @_adds_seconds
    def round(self) -> bool:
        """One measurement, run again (up to ROUND_ATTEMPTS in all) while something compiled during it or other
        threads worked (see ROUND_ATTEMPTS); False where none ran clean (nothing recorded)."""
        for _ in range(ROUND_ATTEMPTS):
            self.guard()
            children, others = children_cpu_seconds(), _other_threads_cpu()
            figures = self._round()
            busy = _other_threads_cpu() - others if self.cpu_clock else 0.0
            if children_cpu_seconds() == children and busy <= OTHER_THREADS_S:
                for kept, value in zip((self.wall, self.per_call, self.kernel), figures):
                    kept.append(value)
                return True
            self.discarded += 1
        return False

    def _round(self) -> Tuple[float, float, float]:
        """(pipelined ms per call, one call's ms, kernel ms) of one round."""
        n = self._count()
        run = self.inputs.run
        self.turn = -(-self.turn // run) * run  # the round starts a run
        ks = self._sets(max(n, len(self.timed)))
        checked = self.watch.plan(len(ks)) if self.watch is not None else set()
        windows = self._windows_on_cpu_clock if self.cpu_clock else self._windows
        per_window, held, kept_checked = windows(ks, checked)
        if self.holding:
            with self.reading():
                self.watch.round_done(per_window, held, kept_checked)
        del held, kept_checked
        self.calls += len(ks)
        wall = min(per_window)
        if self.cpu_clock:  # a call runs in the calling thread: the windows' calls are synced calls already
            per_call = statistics.median(per_window)
        else:
            per_call = self._synced_calls(n)
        # On the CPU clock the kernel time is shown, not graded: profile it in the first round only.
        kernel = self.kernel[0] if self.cpu_clock and self.kernel else self._kernel_ms(n)
        return wall, per_call, kernel

    def _window_size(self, calls: int) -> int:
        """Calls a window takes: a WINDOWS-th of the round's, in whole runs (one launch makes a run's inputs) where
        that stays within WINDOW_BYTES (``_count`` keeps a round's calls within WINDOWS of them)."""
        size = max(1, -(-calls // WINDOWS))
        run = self.inputs.run
        whole = -(-size // run) * run
        per_call = self.inputs.call_bytes + self.output_bytes
        if size > run and (self.cpu_clock or not per_call or whole * per_call <= WINDOW_BYTES):
            return whole
        return size

    def _windows(self, ks: List[int], checked: set) -> Tuple[List[float], list, list]:
        """Pipelined windows: each window's inputs made first; its calls back to back, each call's outputs
        synced without waiting for the device, the device waited for once at the end; the wall time per call of
        each window. Our outputs are kept to the window's end, then sampled; the calls ``checked`` and one drawn
        per window (``held``) are kept to the round's end. Returns (per window ms, held, checked calls)."""
        per_window, held, kept_checked = [], [], []
        step = self._window_size(len(ks))
        for start in range(0, len(ks), step):
            taken = self.inputs.take(ks[start:start + step])
            self._idle()
            kept = []
            span = _Span()
            outs = None
            for k, number, prepared in taken:
                outs = self.impl.call(k, prepared)
                self._sync(outs, False)
                if self.holding:
                    kept.append((k, number, outs))
            self._sync(outs, True)
            per_window.append(span.ms(False) / len(taken))
            del outs, taken
            if self.holding:
                if self.watching:
                    with self.reading():
                        self._sample_window(kept)
                held.append(kept[self.watch.held(len(kept))])
                kept_checked += [call for i, call in enumerate(kept, start=start) if i in checked]
            del kept
        return per_window, held, kept_checked

    def _sample_window(self, kept: list) -> None:
        watch = self.watch
        watch.new_window()
        for (k, number, outs), found in zip(kept, watch.device_samples([outs for _, _, outs in kept])):
            watch.see(k, number, found, outs)

    def _windows_on_cpu_clock(self, ks: List[int], checked: set) -> Tuple[List[float], list, list]:
        """Windows on the CPU clock: a window's calls in runs of ``inputs.run`` (their fresh inputs made before
        each run, off the clock); a few calls drawn per window are looked at right after they return, off the
        clock too: their outputs and the call's before them sampled (ours: compared; the references': dropped).
        Ours ``checked`` and one drawn per window (``held``) are kept to the round's end (keeping every output of a
        window would make each call's output a fresh allocation: 1 MB outputs took twice as long a call on a
        2-core host). Returns (per window ms, held, checked calls)."""
        per_window, held, kept_checked = [], [], []
        step = self._window_size(len(ks))
        for start in range(0, len(ks), step):
            stop = min(len(ks), start + step)
            looked = {start + i for i in self.watch.looks(stop - start)} if self.watch is not None else set()
            hold = start + self.watch.held(stop - start) if self.holding else -1
            total, previous = 0.0, None
            held.append(None)
            if self.watch is not None:
                self.watch.new_window()
            for run in range(start, stop, self.inputs.run):
                taken = self.inputs.take(ks[run:min(run + self.inputs.run, stop)])
                span = _Span()
                for i, (k, number, prepared) in enumerate(taken, start=run):
                    outs = self.impl.call(k, prepared)
                    self._sync(outs, False)
                    if i in looked:
                        total += span.ms(True)
                        for call in ((previous,) if previous is not None else ()) + ((k, number, outs),):
                            self.watch.see(call[0], call[1], self.watch.host_samples(call[2]), call[2])
                        span = _Span()
                    if i == hold:
                        held[-1] = (k, number, outs)
                    if i in checked and self.holding:
                        kept_checked.append((k, number, outs))
                    previous = (k, number, outs)
                total += span.ms(True)
                del taken
            per_window.append(total / (stop - start))
            del previous
        return per_window, held, kept_checked

    def _synced_calls(self, n: int) -> float:
        """The median wall time of up to 64 calls each synced to the device, on fresh inputs."""
        per_call = []
        for k in self._sets(max(1, min(n, 64))):
            [(k, _, prepared)] = self.inputs.take([k])
            self._idle()  # (the copy may still run on the device)
            started = _perf_counter()
            self._sync(self.impl.call(k, prepared), True)
            per_call.append(1e3 * (_perf_counter() - started))
        return statistics.median(per_call)

    def _kernel_ms(self, n: int) -> float:
        if self.is_jittor:
            k = self._sets(1)[0]
            reps = max(1, min(MAX_RERUN, n))
            return profile_kernels(self.impl, k, (1 << (reps.bit_length() - 1)) - 1)
        if self.impl.on_gpu:
            torch = self.impl.torch
            ks = self._sets(n)
            prepared = [self.impl.prepare(k) for k in ks]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for k, p in zip(ks, prepared):
                self.impl.call(k, p)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / n
        return self.wall[-1] if self.wall else 0.0  # PyTorch on the CPU: its kernels are its calls

    def measure(self) -> List[float]:
        """The points measure of each round: max(kernel, pipelined time); on the CPU device the pipelined time
        alone (the kernels run in the calling thread: their time is in it, and the profiler's wall-clock
        figure would only add other processes' noise)."""
        if self.cpu_clock:
            return list(self.wall)
        return [max(k, w) for k, w in zip(self.kernel, self.wall)]

    def best(self) -> Optional[float]:
        rounds = self.measure()
        return min(rounds) if rounds else None

    def timing(self) -> Timing:
        rounds = self.measure()
        if not rounds:
            if self.unclean or self.discarded:
                return Timing(error=f"not measured: jittor compiled (or a process ran) in every timed call "
                                    f"({self.discarded} rounds discarded)", discarded=self.discarded)
            return Timing(error="not measured")
        return Timing(ms=min(rounds), kernel_ms=min(self.kernel), wall_ms=min(self.wall),
                      call_ms=statistics.median(self.per_call), rounds=[round(r, 6) for r in rounds],
                      calls=self.calls, slow=self.slow, seconds=round(self.seconds, 3), discarded=self.discarded)


def near_a_tier(ours: Meter, refs: Sequence[Meter], nbytes: int, stored: Optional[Sequence[float]],
                fraction: float, margin: float = NEAR_TIER) -> bool:
    """Is our best time within ``margin`` of a tier's boundary (``fraction`` x the tier's throughput)?"""
    mine = ours.best()
    if stored:
        tier_ms = [nbytes / (g * 1e9) * 1e3 for g in stored if g]
    else:
        tier_ms = [m.best() for m in refs if m.best()]
    return mine is not None and any(abs(mine * fraction / t - 1.0) < margin for t in tier_ms if t)


def save_outputs(case_dir: str, tag: str, outs, spares: Optional[str] = None) -> List[List[str]]:
    """Each output as ``<tag>_<i>.npy`` in its own NumPy dtype, into a spare's pages from ``spares`` where one
    fits (``ops.scoring.spare``); returns [[file, jittor dtype], ...]."""
    listed = []
    for i, v in enumerate(outs):
        name = f"{tag}_{i}.npy"
        spare.save(os.path.join(case_dir, name), hand_back_array(v), spares)
        listed.append([name, str(v.dtype)])
    return listed


class ReferenceFailed(Exception):
    pass


def build_reference(fam: Family, case: Case, name: str, sets):
    """The implementation object of reference ``name``; raises ``ReferenceSkipped`` or any error."""
    if name == "naive":
        return JittorImpl(case, lambda c, xs: fam.naive_forward(c, xs), sets)
    if name == "jittor":
        probe = fam.jittor_forward(case, sets[0].xs)
        if probe is None:
            raise ReferenceFailed("no built-in")
        return JittorImpl(case, lambda c, xs: fam.jittor_forward(c, xs), sets)
    if name in ("torch", "compile"):
        return TorchImpl(fam, case, sets, compiled=name == "compile")
    raise ValueError(f"unknown reference {name!r}")


def compiled_kernels() -> int:
    """How many compiled ops jittor's kernel cache holds (the new ones since a count are the compiles between)."""
    folder = os.path.join(jt.flags.cache_path, "jit")
    try:
        return sum(name.endswith(".so") for name in os.listdir(folder))
    except OSError:
        return 0


# --- in-process helpers for A/B scripts (docs/benchmarking.md): kernel time of one graph, no judging ---------------

def time_jittor(builder: Callable[[], list], repeats: int = 5) -> float:
    """Median kernel ms of ``builder()``'s graph over ``repeats`` profiles (after a warm call)."""
    built = Graph(builder)
    jt.sync(builder(), device_sync=True)
    estimate = profile_kernels(built, 0, 0)
    reps = max(1, min(MAX_RERUN, int(TARGET_MS / max(estimate, 1e-4))))
    return statistics.median(profile_kernels(built, 0, (1 << (reps.bit_length() - 1)) - 1) for _ in range(repeats))


class CaseRunner:
    """One case's random inputs in this process: ``builder(forward)`` builds the graph the grader times
    (the forward under no_grad, or only the backward)."""

    def __init__(self, fam: Family, case: Case, api, seed: int):
        self.fam, self.case, self.api = fam, case, api
        rng = np.random.default_rng(seed)
        arrays = fam.make_inputs(case, rng)
        grads = fam.make_grads(case, rng) if case.direction == "bwd" else []
        self.sets = [InputSet(arrays, input_dtypes(case, arrays), grads, case.dtype)]

    def ours_forward(self, case, xs):
        return self.fam.forward(case, self.api, xs)

    def builder(self, forward: Callable) -> Callable[[], list]:
        impl = JittorImpl(self.case, forward, self.sets)
        return lambda: impl.call(0, impl.prepare(0))
