"""The grader's compile pass, run by one worker before any case is timed: build every case's graphs exactly as
they are timed (ours, the naive composite, jittor's built-in; forwards under no_grad, backwards as timed) and
sync them in batches, so that jittor compiles each batch's new kernels in parallel (one nvcc per kernel,
16 at a time on a 16-core host) instead of one by one inside timed cases.

What it knows between runs lives in jittor's kernel folder (``<cache_path>/jit``), so that clearing that
folder forgets it too:
* kernels that do not compile (jittor's own max_pool3d for float16/bfloat16 with CUDA 13, say): they fail
  the same way for every case of their family, implementation, dtype and direction, in every run of this
  jittor and compiler; each retry costs seconds of nvcc, and one failure inside a batch stops jittor's
  parallel compile of the whole batch (``FAILED_COMPILES_FILE``; delete it to try them again);
* the cases whose graphs a finished pass built, under a fingerprint of the code that builds them: a later run
  builds only the cases it has not built yet (``COMPILED_FILE``), and none where a run of the same or more
  cases came before.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Sequence

import numpy as np

from .._jittor import jt
from . import compile_record as record
from . import fresh
from .compile_record import FAILED_COMPILES_FILE, PASS_IMPLS
from .harness import InputSet, JittorImpl, compiled_kernels, for_hand_back, input_dtypes, upload
from .logs import LOG_TAIL, compile_reason, log_size, read_log, without_colors
from .spec import Case

COMPILE_FAILURE_MARKS = ("Compile operator", "Compile fused operator", "compilation of", "Check failed: ret")


def _folder() -> str:
    return os.path.join(jt.flags.cache_path, "jit")


def compile_key(case: Case, name: str) -> str:
    return f"{case.family}/{name}/{case.dtype}/{case.direction}"


def is_compile_failure(err: BaseException) -> bool:
    return any(m in str(err) for m in COMPILE_FAILURE_MARKS)


# The worker's log file (its stderr, where jittor's compilers write): set by the worker, read for the reason
# of a failed compile.
LOG_PATH = None


def failed_compiles() -> Dict[str, dict]:
    """{compile key: {"case": where it first failed, "reason": one line, "log": the compiler's output}} from
    earlier runs with this kernel cache."""
    return {k: v for k, v in record.load(_folder(), FAILED_COMPILES_FILE).items() if isinstance(v, dict)}


def remember_failed_compile(key: str, case_id: str, error: str) -> None:
    """Record a failed compile with the first error line and the tail of what the compiler wrote to the log."""
    if key in failed_compiles():
        return
    log = without_colors(read_log(LOG_PATH))[-LOG_TAIL:]
    record.add(_folder(), FAILED_COMPILES_FILE, key, {"case": case_id, "reason": compile_reason(log) or error,
                                                      "log": log})


def fingerprint(api) -> str:
    """``code_fingerprint`` of an imported graded module."""
    return code_fingerprint(getattr(api, "__name__", ""), getattr(api, "__file__", "") or "")


def code_fingerprint(name: str, module_file: str) -> str:
    """``compile_record.code_fingerprint`` under this jittor."""
    return record.code_fingerprint(jt.__version__, name, module_file)


def compiled_cases(code: str, names: Sequence[str] = PASS_IMPLS) -> set:
    """``compile_record.compiled_cases`` in this jittor's kernel folder."""
    return record.compiled_cases(_folder(), code, names)


def remember_compiled(code: str, case_ids: Sequence[str], names: Sequence[str] = PASS_IMPLS) -> None:
    record.remember_compiled(_folder(), code, case_ids, names)


def handed_back(outs) -> list:
    """Our outputs and the copies the worker makes to hand them back (``harness.for_hand_back``: bfloat16 bits,
    one kernel that would otherwise compile inside a timed case's check, ~6 s on an H100 host). Not for the
    references: their outputs are not handed back."""
    outs = list(outs)
    return outs + [h for o, h in zip(outs, map(for_hand_back, outs)) if h is not o]


def ours_forward(fam, api) -> Callable:
    """The graded module's forward for ``fam``'s cases, bound now: a batch builds its graphs after the loop
    that collected them has moved on to other families."""
    return lambda c, xs: fam.forward(c, api, xs)


def probe_known_failures(items, failed: Dict[str, dict], stats: "SyncStats") -> List[dict]:
    """Each family's known compile failures (``Family.known_compile_failures``) that concern ``items`` and are
    not remembered yet: build and sync the probe alone; where it fails with the known marker, remember every
    key it names (``failed`` and ``FAILED_COMPILES_FILE``), so that no batch syncs them. Where the probe
    compiles, or fails otherwise, nothing is assumed: the batches find out as usual. Returns one record per
    probe run."""
    families: Dict[str, object] = {}
    for fam, _ in items:
        families.setdefault(fam.name, fam)
    wanted = {compile_key(c, "jittor") for _, c in items}
    records = []
    for fam in families.values():
        for known in fam.known_compile_failures():
            keys = [k for k in known.keys if k in wanted and k not in failed]
            if not keys:
                continue
            started, mark, hit = time.monotonic(), log_size(LOG_PATH), False
            try:
                arrays, grads = fam.zero_inputs(known.probe)
                sets = [InputSet.placeholders(arrays, input_dtypes(known.probe, arrays), grads, known.probe.dtype)]
                impl = JittorImpl(known.probe, fam.jittor_forward, sets)
                stats.sync(impl.call(0, impl.prepare(0)))
            except Exception as err:
                hit = known.marker in str(err) or known.marker in read_log(LOG_PATH, mark)
            if hit:
                for key in keys:
                    failed[key] = {"case": known.probe.id}
                    remember_failed_compile(key, known.probe.id, f"compile failed: {known.why}")
            records.append({"probe": known.probe.id, "failed": hit, "keys": len(keys),
                            "seconds": round(time.monotonic() - started, 2)})
    return records


def warm_graphs(items, api, limit_bytes: int, report: Callable[[str, dict], None] = lambda kind, d: None,
                names: Sequence[str] = PASS_IMPLS) -> int:
    """Build and sync the graphs of the implementations ``names`` (of ``PASS_IMPLS``) of each case (``items``:
    (family, case)), in batches of at most ``limit_bytes`` of inputs (uninitialized: values never change which
    kernels compile). Best effort: a graph that fails here fails again, with its reason, when timed.
    ``report("start", {"items": n})`` comes before a batch's syncs (``n`` of ``items`` consumed by it: a crash in
    that batch loses those), ``report("batch", {...})`` after them with its figures; before the batches, the known
    failures' probes (``probe_known_failures``) report as a batch of no items. Returns how many graphs ran."""
    batch: List[tuple] = []
    held, built, consumed, made_s = 0, 0, 0, 0.0
    failed = failed_compiles()

    def on_failure(key, case_id, err):
        if is_compile_failure(err):
            failed[key] = {"case": case_id}
            remember_failed_compile(key, case_id, str(err)[:160])

    stats = SyncStats()
    report("start", {"items": 0})
    probes = probe_known_failures(items, failed, stats)
    if probes:
        report("batch", {"items": 0, "probes": probes, **stats.figures()})
    _sync_bisect(grader_graphs(items), stats)

    def run(step):
        """``step(impl, name)`` for every graph of the batch not known to fail; ours and the naive composite synced
        together (their kernels always compile), jittor's built-ins in groups by compile key, bisected over
        the groups on a failure. Returns how many graphs built."""
        trusted, groups, ok = [], {}, 0
        for key, case_id, impl in batch:
            if key in failed:
                continue
            name = key.split("/")[1]
            try:
                vs = step(impl, name)
                ok += 1
            except Exception:
                continue
            if name == "jittor":
                groups.setdefault(key, (case_id, []))[1].extend(vs)
            else:
                trusted += vs
        _sync_bisect(trusted, stats)
        _sync_groups([(key, case_id, vs) for key, (case_id, vs) in groups.items()], on_failure, stats)
        return ok

    host_dtypes, uploaded = set(), set()  # of the inputs seen; those whose upload kernel was compiled

    def flush():
        nonlocal batch, held, built, consumed, made_s, stats
        report("start", {"items": consumed})
        started, kernels, stats = time.monotonic(), compiled_kernels(), SyncStats()  # this batch's syncs
        if jt.flags.use_cuda:  # the worker's direct uploads of inputs (harness.upload): one kernel per dtype
            tiny = [np.zeros(1, d) for d in sorted(host_dtypes - uploaded)]
            _sync_bisect([upload(a, str(a.dtype)) for a in tiny], stats)
            uploaded.update(str(a.dtype) for a in tiny)
        run(lambda impl, name: impl.stage(0))  # the forwards that backward graphs start from, compiled together first
        staged = time.monotonic()
        ok = run(lambda impl, name: (handed_back if name == "ours" else list)(impl.call(0, impl.prepare(0))))
        report("batch", {"items": consumed, "graphs": ok, "kernels": compiled_kernels() - kernels,
                         "inputs_s": round(made_s, 2), "staged_s": round(staged - started, 2),
                         "graphs_s": round(time.monotonic() - staged, 2), **stats.figures()})
        built += ok
        batch, held, consumed, made_s = [], 0, 0, 0.0
        jt.gc()

    for fam, case in items:
        started = time.monotonic()
        try:
            arrays, grads = fam.zero_inputs(case)
            size = sum(a.nbytes for a in arrays) + sum(g.nbytes for g in grads)
            if batch and held + size > limit_bytes:
                flushing = time.monotonic()
                flush()
                started += time.monotonic() - flushing  # the batch's syncs are not this case's inputs
            sets = [InputSet.placeholders(arrays, input_dtypes(case, arrays), grads, case.dtype)]
            host_dtypes.update(str(a.dtype) for a in arrays + grads)
        except Exception:
            consumed += 1
            continue
        made_s += time.monotonic() - started
        for name, forward in (("ours", ours_forward(fam, api)), ("naive", fam.naive_forward),
                              ("jittor", fam.jittor_forward)):
            if name not in names:
                continue
            batch.append((compile_key(case, name), case.id, JittorImpl(case, forward, sets)))
        held += size
        consumed += 1
    if consumed:
        flush()
    return built


def grader_graphs(items) -> list:
    """The grader's own kernels the timed calls of ``items`` need (``ops.scoring.fresh``): their inputs' fresh
    copies, one launch making one copy or MAX_COPIES, of every dtype the calls vary (a forward's inputs, a
    backward's output gradients); on the GPU the samples of our outputs in the dtypes they may have (the case's,
    integer indices, bool). One kernel per dtype and count, whatever the shapes."""
    varied, outputs = set(), {"int32", "int64", "bool", "int8"}
    for fam, case in items:
        arrays, grads = fam.zero_inputs(case)
        varied.update(input_dtypes(case, arrays) if case.direction == "fwd" else [case.dtype] * len(grads))
        outputs.add(case.dtype)
    graphs = []
    for dtype in sorted(varied):
        x = jt.empty((fresh.MAX_COPIES,), dtype)
        graphs += fresh.fresh_copies(x, dtype, (1, 2), 0, 1) + fresh.fresh_copies(x, dtype, (1, 2), 0, fresh.MAX_COPIES)
    if jt.flags.use_cuda:
        positions = jt.zeros((fresh.SAMPLES,), "int32")
        for dtype in sorted(outputs):
            out = jt.empty((fresh.SAMPLES,), dtype)
            graphs += [fresh.sample_op([out], positions), fresh.sample_op([out] * fresh.MAX_COPIES, positions)]
    return graphs


class SyncStats:
    """What a compile pass's syncs cost: all of them, and those that failed (a failing kernel's nvcc run, the
    syncs a bisection repeats): the figures that say what failing compiles cost a run on an empty cache."""

    def __init__(self):
        self.syncs, self.failed, self.failed_s = 0, 0, 0.0

    def sync(self, vs) -> None:
        started = time.monotonic()
        self.syncs += 1
        try:
            jt.sync(vs)
        except Exception:
            self.failed += 1
            self.failed_s += time.monotonic() - started
            raise

    def figures(self) -> dict:
        return {"syncs": self.syncs, "failed_syncs": self.failed, "failed_syncs_s": round(self.failed_s, 2)}


def _sync_groups(groups, on_failure, stats: SyncStats) -> None:
    """Sync groups of Vars (key, case id, Vars) at once; on a failure, bisect over the groups and report each
    failing group's key (``on_failure(key, case_id, error)``). jittor stops compiling a sync's kernels at its
    first failure; the kernels compiled by then stay in its cache, and a group that synced is done."""
    groups = [g for g in groups if g[2]]
    if not groups:
        return
    try:
        stats.sync([v for _, _, vs in groups for v in vs])
    except Exception as err:
        if len(groups) == 1:
            on_failure(groups[0][0], groups[0][1], err)
            return
        _sync_groups(groups[:len(groups) // 2], on_failure, stats)
        _sync_groups(groups[len(groups) // 2:], on_failure, stats)


def _sync_bisect(vs, stats: SyncStats) -> None:
    """Sync in one batch (jittor compiles its new kernels in parallel); on a failure, bisect, so that one
    kernel that does not compile costs log2(n) batches, not n single compiles."""
    if not vs:
        return
    try:
        stats.sync(vs)
    except Exception:
        if len(vs) > 1:
            _sync_bisect(vs[:len(vs) // 2], stats)
            _sync_bisect(vs[len(vs) // 2:], stats)
