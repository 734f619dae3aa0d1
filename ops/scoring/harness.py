"""Running one case: inputs, correctness against the float64 reference, kernel timing of each implementation.

Timing: jittor code (ours, the naive composite, jittor's built-in) is timed with jittor's profiler, which
re-runs each kernel of the graph back to back and reports kernel time without Python overhead; PyTorch with
CUDA events around back-to-back calls. Both: warm-up first, then the median of ``REPEATS`` measurements.
Backward cases time only the backward: the forward outputs are computed first, and the output gradient is
injected (``_InjectGrad``) so that the op's own gradient code is all that runs.
"""
from __future__ import annotations

import re
import statistics
import time
from typing import Callable, Optional, Sequence

import numpy as np

from .._jittor import jt
from .grading import CaseResult, Timing
from .spec import Case, Family, ReferenceSkipped, random_array

REPEATS = 5
TARGET_MS = 10.0  # each measurement runs the op about this long: 10 ms amortizes a ~5 us launch to 0.05%
MAX_RERUN = 256
SLOW_MS = 100.0  # a single call slower than this is measured fewer times
VERY_SLOW_MS = 1000.0  # a single call slower than this is measured once: its median would cost seconds


_COMPILE_FAILURES: dict = {}
_COMPILE_FAILURE_MARKS = ("Compile operator", "compilation of", "Check failed: ret")


class _InjectGrad(jt.Function):
    """Identity whose gradient is a given tensor: the op upstream receives exactly ``dy``."""

    def execute(self, y, dy):
        self.dy = dy
        return y.clone()

    def grad(self, _):
        return self.dy, None


def to_jittor(arr: np.ndarray, dtype: str):
    """A jittor Var of ``dtype`` holding ``arr`` exactly (jt.array alone narrows int64 and float64)."""
    if dtype == "bfloat16":
        return jt.array(arr.astype(np.float32), "float32").astype("bfloat16")
    return jt.array(arr, dtype)


def to_numpy64(v) -> np.ndarray:
    if str(v.dtype) == "bfloat16":
        v = v.float32()
    a = v.numpy()
    return a.astype(np.float64) if a.dtype.kind in "fc" else a


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float):
    """(ok, max abs error, why). NaN must match NaN; shapes must match exactly."""
    if tuple(got.shape) != tuple(want.shape):
        return False, None, f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    if want.dtype.kind not in "fc":
        bad = int(np.count_nonzero(got != want))
        return bad == 0, float(bad), "" if bad == 0 else f"{bad} elements differ"
    nan_want, nan_got = np.isnan(want), np.isnan(got)
    if not np.array_equal(nan_want, nan_got):
        return False, None, f"NaN mismatch at {int(np.count_nonzero(nan_want != nan_got))} elements"
    g, w = np.where(nan_got, 0, got), np.where(nan_want, 0, want)
    err = np.abs(g - w)
    max_err = float(err.max()) if err.size else 0.0
    bad = err > atol + rtol * np.abs(w)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return False, max_err, f"{int(bad.sum())} elements off, first at {idx}: got {g[idx]!r}, want {w[idx]!r}"
    return True, max_err, ""


# --- timing ------------------------------------------------------------------------------------------------

def _profile(builder: Callable[[], list], rerun: int) -> float:
    """Kernel time in ms of one call of ``builder``'s graph."""
    with jt.profile_scope(1, rerun) as report:
        jt.sync(builder(), device_sync=True)
    rows = report[1:]
    if not rows:
        raise RuntimeError("no kernel ran")
    reps = min(int(float(r[2])) for r in rows)  # every kernel ran at least once per call
    return sum(float(r[3]) for r in rows) / reps / 1e6


def _plan(estimate_ms: float):
    """(calls per measurement, measurements) for an op that takes about ``estimate_ms``."""
    reps = max(1, min(MAX_RERUN, int(TARGET_MS / max(estimate_ms, 1e-4))))
    return reps, (2 if estimate_ms > SLOW_MS else REPEATS)


def time_jittor(builder: Callable[[], list]) -> float:
    jt.sync(builder(), device_sync=True)  # compile and warm
    estimate = _profile(builder, 0)
    if estimate > VERY_SLOW_MS:
        return estimate
    reps, count = _plan(estimate)
    rerun = (1 << (reps.bit_length() - 1)) - 1  # jittor re-runs 2^k times
    return statistics.median(_profile(builder, rerun) for _ in range(count))


def time_torch(call: Callable[[], object]) -> float:
    import torch

    on_gpu = torch.cuda.is_available() and jt.flags.use_cuda

    def run(n):
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                call()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / n
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        return (time.perf_counter() - t0) * 1e3 / n

    for _ in range(3):
        call()
    estimate = run(1)
    if estimate > VERY_SLOW_MS:
        return estimate
    reps, count = _plan(estimate)
    return statistics.median(run(reps) for _ in range(count))


# --- one case ----------------------------------------------------------------------------------------------

class CaseRunner:
    """Everything about one case for one process: inputs, results, timings."""

    def __init__(self, fam: Family, case: Case, api, seed: int):
        self.fam, self.case, self.api = fam, case, api
        self.rng = np.random.default_rng(seed)
        self.arrays = fam.make_inputs(case, self.rng)
        self.xs = [to_jittor(a, case.dtype if a.dtype.kind == "f" else str(a.dtype)) for a in self.arrays]
        jt.sync(self.xs)
        self.dys = None

    # jittor graphs -------------------------------------------------------------------------------------
    def _targets(self):
        return [self.xs[i] for i in self.case.grad_of]

    def builder(self, forward: Callable) -> Callable[[], list]:
        """A function building the graph to time: the forward, or (bwd cases) only the backward."""
        if self.case.direction == "fwd":
            def forward_only():  # as PyTorch is timed: no autograd bookkeeping (e.g. saved argmax indices)
                with jt.no_grad():
                    return list(forward(self.case, self.xs))
            return forward_only
        outs = list(forward(self.case, self.xs))
        jt.sync(outs)
        if self.dys is None:
            self.dy_arrays = [random_array(tuple(o.shape), self.case.dtype, self.rng) for o in outs]
            self.dys = [to_jittor(a, self.case.dtype) for a in self.dy_arrays]
            jt.sync(self.dys)

        def backward():
            loss = sum(_InjectGrad.apply(o, d).sum() for o, d in zip(outs, self.dys))
            return jt.grad(loss, self._targets())
        return backward

    def check(self, result: CaseResult) -> None:
        """Run ours once and compare with the float64 reference; fills ``correct``/``why``/``max_error``."""
        got = [to_numpy64(v) for v in self.builder(self.ours_forward)()]
        if self.case.direction == "fwd":
            want = self.fam.reference_forward(self.case, self.arrays)
        else:
            want = self.fam.reference_backward(self.case, self.arrays, self.dy_arrays)
        rtol, atol = self.fam.tolerance(self.case)
        if len(got) != len(want):
            result.correct, result.why = False, f"{len(got)} outputs, expected {len(want)}"
            return
        worst = 0.0
        for i, (g, w) in enumerate(zip(got, want)):
            ok, err, why = compare(g, np.asarray(w), rtol, atol)
            if err is not None:
                worst = max(worst, err)
            if not ok:
                result.correct, result.why, result.max_error = False, f"output {i}: {why}", err
                return
        result.correct, result.max_error = True, worst

    def ours_forward(self, case, xs):
        return self.fam.forward(case, self.api, xs)

    # references --------------------------------------------------------------------------------------------
    def time_reference(self, name: str) -> Timing:
        # A reference whose kernel failed to compile fails the same way for every case of its family, dtype
        # and direction; each retry costs seconds of nvcc (jittor's fp16 max_pool3d on CUDA 13, say).
        key = (self.case.family, name, self.case.dtype, self.case.direction)
        if key in _COMPILE_FAILURES:
            return Timing(error=_COMPILE_FAILURES[key])
        timing = self._time_reference(name)
        if timing.error and any(m in timing.error for m in _COMPILE_FAILURE_MARKS):
            _COMPILE_FAILURES[key] = f"as {self.case.id}: {timing.error}"
        return timing

    def _time_reference(self, name: str) -> Timing:
        try:
            if name == "naive":
                return Timing(time_jittor(self.builder(self.fam.naive_forward)))
            if name == "jittor":
                probe = self.fam.jittor_forward(self.case, self.xs)
                if probe is None:
                    return Timing(error="no built-in")
                return Timing(time_jittor(self.builder(self.fam.jittor_forward)))
            if name in ("torch", "compile"):
                return Timing(self._time_torch(compiled=name == "compile"))
            raise ValueError(name)
        except ReferenceSkipped as why:
            return Timing(error=f"skipped: {why}")
        except Exception as err:  # a failing reference is a result, not a crash
            return Timing(error=_short(err))

    def _time_torch(self, compiled: bool) -> float:
        import torch

        device = "cuda" if jt.flags.use_cuda else "cpu"
        tdtype = getattr(torch, self.case.dtype)
        ts = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in self.arrays]
        ts = [t.to(tdtype) if t.is_floating_point() else t for t in ts]
        if self.fam.torch_forward(self.case, ts) is None:
            raise RuntimeError("no PyTorch counterpart")

        def fn(*tensors):
            return self.fam.torch_forward(self.case, list(tensors))
        if compiled:
            fn = torch.compile(fn, dynamic=False)
        if self.case.direction == "fwd":
            with torch.no_grad():
                return time_torch(lambda: fn(*ts))
        for i in self.case.grad_of:
            ts[i].requires_grad_()
        outs = list(fn(*ts))
        dys = [torch.from_numpy(np.ascontiguousarray(a)).to(device).to(tdtype) for a in self.dy_arrays]
        targets = [ts[i] for i in self.case.grad_of]
        # Gradients are made dense, as ours are: PyTorch's permute backward returns a strided view of dy, which
        # would otherwise be timed as free and leave the copy to whoever uses the gradient (a no-op for a
        # gradient that is already contiguous).
        return time_torch(lambda: [g.contiguous() for g in
                                   torch.autograd.grad(outs, targets, dys, retain_graph=True)])


def _short(err: BaseException, limit: int = 160) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(err).__name__}: {err}").replace("\n", " ")
    for marker in ("Reason:", "Failed reason:"):
        if marker in text:
            text = text.split(marker, 1)[1].strip()
    return text[:limit]


def run_case(fam: Family, case: Case, api, seed: int, references: Sequence[str],
             variant: Optional[str] = None, on_ours: Optional[Callable[[CaseResult], None]] = None) -> CaseResult:
    """Check and time ours, then time each reference. ``on_ours`` sees the result before the references run,
    so that a reference that hangs or crashes cannot take our verdict with it."""
    result = CaseResult(case.id, fam.bytes_moved(case), fam.flops(case))
    try:
        result.variant = variant if variant is not None else fam.variant(case, api)
    except Exception as err:
        result.variant = f"? ({_short(err, 40)})"
    try:
        runner = CaseRunner(fam, case, api, seed)
        runner.check(result)
        if result.correct:
            result.ours = Timing(time_jittor(runner.builder(runner.ours_forward)))
    except Exception as err:
        result.correct, result.why = False, "crashed: " + _short(err)
        return result
    if on_ours is not None:
        on_ours(result)
    for name in references:
        result.refs[name] = runner.time_reference(name)
        if on_ours is not None:
            on_ours(result)
    return result


def warm_cases(items, api, seed: int) -> int:
    """Build every case's graphs (ours, naive, jittor's built-in; forward, then backward) and sync them in two
    batches, so that jittor compiles their kernels in parallel instead of one by one during timing.

    Best effort: a graph that fails here fails again, with its reason, in the timed run. Returns how many
    graphs were built.
    """
    def sync_all(vs):
        """Sync in one batch (jittor compiles its new kernels in parallel); on a failure, bisect, so that
        one kernel that does not compile costs log2(n) batches, not n single compiles."""
        if not vs:
            return
        try:
            jt.sync(vs)
        except Exception:
            if len(vs) > 1:
                sync_all(vs[:len(vs) // 2])
                sync_all(vs[len(vs) // 2:])

    runners, built = [], 0
    forwards = []
    for fam, case in items:
        try:
            runner = CaseRunner(fam, case, api, seed)
        except Exception:
            continue
        impls = [runner.ours_forward, fam.naive_forward, fam.jittor_forward]
        runners.append((runner, impls))
        for impl in impls:
            try:
                forwards += [v for v in (impl(case, runner.xs) or [])]
                built += 1
            except Exception:
                pass
    sync_all(forwards)
    backwards = []
    for runner, impls in runners:
        if runner.case.direction != "bwd":
            continue
        for impl in impls:
            try:
                backwards += list(runner.builder(impl)())
                built += 1
            except Exception:
                pass
    sync_all(backwards)
    return built
