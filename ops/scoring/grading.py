"""Scoring math, free of jittor and timing: throughput, roofline, tiers, points, summary.

Tiers follow the MaxPool3D assignment's grader (seed 004): three reference throughputs per case; a case earns
40, 70 or 100 points when our throughput reaches ``TIER_FRACTION`` of the first, second or third tier, and 0
when its result is wrong. Default tiers: the naive jittor composite, jittor's built-in op, the fastest
reference measured in the same run.

Times (``Timing.ms``) are ``max(kernel time, pipelined wall time per call)`` of the fastest of several
interleaved rounds (see ``ops.scoring.harness``): other processes only ever slow a round down, so the fastest
round is the figure that repeats from run to run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Sequence

TIER_POINTS = (40, 70, 100)
TIER_FRACTION = 0.95
REFERENCES = ("naive", "jittor", "torch", "compile")
WRONG_FLAG = "judged_wrong"  # a file in a case's folder: the checked call was wrong, our rounds may stop


@dataclass
class Timing:
    """One implementation's outcome on one case: its times in ms, or why there are none."""

    ms: Optional[float] = None  # what points use: max(kernel, wall) of the fastest round
    error: Optional[str] = None
    kernel_ms: Optional[float] = None  # jittor's profiler / CUDA events: kernels only (fastest round)
    wall_ms: Optional[float] = None  # pipelined wall time per call over the rotated input sets (fastest round)
    call_ms: Optional[float] = None  # wall time of one call synced to the device (median)
    rounds: List[float] = field(default_factory=list)  # ms of each interleaved round
    calls: Optional[int] = None  # timed calls in all
    slow: bool = False  # slower than harness.SLOW_MS a call: timed a bounded number of calls
    log: Optional[str] = None  # the worker's stderr while this implementation failed (compiler output)
    seconds: Optional[float] = None  # the worker's time spent timing it (warm-up and rounds)
    discarded: int = 0  # rounds run again because jittor compiled (or a process ran) during them

    @property
    def ok(self) -> bool:
        return self.ms is not None and self.ms > 0 and self.error is None


@dataclass
class CaseResult:
    case_id: str
    nbytes: int
    flops: Optional[int] = None
    variant: str = "-"
    correct: bool = False
    why: str = ""  # why the case is wrong or failed ("" when correct)
    max_error: Optional[float] = None
    ours: Timing = field(default_factory=Timing)
    refs: Dict[str, Timing] = field(default_factory=dict)
    tiers: Optional[List[float]] = None  # GB/s
    tiers_source: str = "this run"  # "this run", "stored", or why stored tiers did not apply
    points: int = 0
    seconds: Optional[float] = None  # wall time of the case: inputs, references, every timing, the checks
    checked: int = 0  # outputs compared with the reference (the check call's and the timed calls')
    phases: Dict[str, float] = field(default_factory=dict)  # seconds per step: prepare (inputs and references, made
    # in advance on a GPU host), each worker phase, judge; on a GPU host also the worker's idle time around the
    # case: wait_prepare (for its preparation) and wait_judges (for earlier cases' judges, after it)


def gbps(nbytes: int, ms: Optional[float]) -> Optional[float]:
    return None if not ms else nbytes / (ms * 1e-3) / 1e9


# A call costs a few microseconds whatever it moves (jittor's per-op host work, a kernel launch): a case whose
# bytes would cross the copy roofline faster than this is timed by that fixed cost, not by its bytes.
ROOFLINE_MIN_US = 1.0


def compute_bound(result: CaseResult) -> bool:
    """The case's work is its arithmetic: it has a flops model and does at least one flop per byte it must move
    (timex; not timex's B1 C1 T1, 2 flops on 12 bytes). Its throughput is given in FLOP/s."""
    return bool(result.flops) and result.flops >= result.nbytes


def roofline(result: CaseResult, copy_gbps: Optional[float], cache_bytes: Optional[int] = None) -> Optional[float]:
    """Our throughput over the copy roofline (the copy bandwidth of a buffer larger than any cache), where that
    model applies, else None: not for a compute-bound case, nor for one whose bytes fit in the device's last-level
    cache (``cache_bytes``, where known: those run from the cache and can beat a copy of memory, 170-324% on the
    2-core CPU machine), nor for one whose bytes the roofline moves in under ``ROOFLINE_MIN_US``."""
    ours = gbps(result.nbytes, result.ours.ms) if result.ours.ok and result.correct else None
    if not ours or not copy_gbps or compute_bound(result):
        return None
    if cache_bytes and result.nbytes <= cache_bytes:
        return None
    if result.nbytes / (copy_gbps * 1e3) < ROOFLINE_MIN_US:
        return None
    return ours / copy_gbps


def default_tiers(nbytes: int, refs: Dict[str, Timing]) -> Optional[List[float]]:
    """[naive, jittor built-in, fastest reference] throughputs in GB/s, made non-decreasing.

    A failed reference leaves its tier to the one below; with no successful reference there are no tiers.
    """
    ok = {name: gbps(nbytes, t.ms) for name, t in refs.items() if t.ok}
    if not ok:
        return None
    first = ok.get("naive", min(ok.values()))
    second = max(first, ok.get("jittor", first))
    third = max(second, max(ok.values()))
    return [first, second, third]


def points_for(ours_gbps: Optional[float], tiers: Optional[Sequence[float]], correct: bool) -> int:
    if not correct or ours_gbps is None:
        return 0
    if not tiers:
        # Nothing to compare with earns nothing: a module that made every reference fail or time out (hogging the
        # device during their warm-up, say) must not win the case's points with any speed.
        return 0
    earned = 0
    for tier, pts in zip(tiers, TIER_POINTS):
        if ours_gbps >= TIER_FRACTION * tier:
            earned = pts
    return earned


def grade(result: CaseResult, stored_tiers: Optional[Sequence[float]] = None,
          tiers_source: Optional[str] = None) -> CaseResult:
    """Fill ``tiers`` (stored ones win), ``tiers_source`` and ``points``."""
    ours = gbps(result.nbytes, result.ours.ms) if result.ours.ok else None
    if stored_tiers is not None:
        result.tiers, result.tiers_source = list(stored_tiers), tiers_source or "stored"
    else:
        result.tiers = default_tiers(result.nbytes, result.refs)
        result.tiers_source = tiers_source or "this run"
        if result.tiers is None:
            result.tiers_source = "none: no reference measured, so no points"
    result.points = points_for(ours, result.tiers, result.correct)
    return result


def speedup(result: CaseResult, ref: str, measure: str = "ms") -> Optional[float]:
    """Reference time / our time by ``measure`` ("ms": the points measure; "call_ms": one synced call)."""
    t = result.refs.get(ref)
    if not (result.correct and result.ours.ok and t is not None and t.ok):
        return None
    mine, theirs = getattr(result.ours, measure), getattr(t, measure)
    return theirs / mine if mine and theirs else None


def geomean(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(results: Sequence[CaseResult], copy_gbps: Optional[float], cache_bytes: Optional[int] = None) -> dict:
    """Points, speedups and the median roofline fraction over the cases where the roofline applies."""
    refs = sorted({r for res in results for r in res.refs}, key=lambda r: REFERENCES.index(r)
                  if r in REFERENCES else len(REFERENCES))
    geo = {ref: geomean([speedup(res, ref) for res in results]) for ref in refs}
    geo_call = {ref: geomean([speedup(res, ref, "call_ms") for res in results]) for ref in refs}
    roof = [f for f in (roofline(r, copy_gbps, cache_bytes) for r in results) if f is not None]
    return {
        "cases": len(results),
        "correct": sum(r.correct for r in results),
        "points": sum(r.points for r in results),
        "max_points": TIER_POINTS[-1] * len(results),
        "geomean_speedup": geo,
        "geomean_speedup_per_call": geo_call,
        "slower_than": {ref: [r.case_id for r in results if (speedup(r, ref) or 1.0) < 1.0] for ref in refs},
        "median_roofline": sorted(roof)[len(roof) // 2] if roof else None,
        "roofline_cases": len(roof),
    }


def result_from_json(d: dict) -> CaseResult:
    """A result as ``CaseResult.__dict__`` saved it in JSON (``--json``), read back."""
    d = dict(d)  # runs saved before a field existed lack it: its default applies
    known = {f.name for f in fields(Timing)}
    d["ours"] = Timing(**{k: v for k, v in d["ours"].items() if k in known})
    d["refs"] = {k: Timing(**{f: x for f, x in v.items() if f in known}) for k, v in d["refs"].items()}
    names = {f.name for f in fields(CaseResult)}
    return CaseResult(**{k: v for k, v in d.items() if k in names})


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
