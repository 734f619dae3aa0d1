"""The verdict on a case: our outputs the worker handed back (the checked call's, timed calls', samples of drawn
calls) against float64 references computed here, in the parent, where nothing the graded module does can reach
them."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Optional, Tuple

import numpy as np

from . import budget, fresh
from .judge import host_values, judge
from .prepare import Prepared, expected_outputs
from .spec import Case, Family


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
    step = max(1, budget.ROW_BLOCK_ELEMENTS // max(1, int(np.prod(got.shape[1:]))))

    def one(start):
        return judge(host_values(np.asarray(got[start:start + step]), dtype), dtype, block(slice(start, start + step)),
                     origin=(start,))

    verdicts = []
    with ThreadPoolExecutor(max(1, threads)) as pool:
        futures = [pool.submit(one, start) for start in range(0, n, step)]
        for i, future in enumerate(futures):
            verdicts.append(future.result())
            if not verdicts[-1][0]:
                # The first failing block decides; a wrong output fails every block, and judging a block that
                # fails costs ~8x one that passes (a faithful judge's exact sums for every element).
                for later in futures[i + 1:]:
                    later.cancel()
                ok, err, why = verdicts[-1]
                rest = len(futures) - i - 1
                return False, err, why + (f" (rows from {(i + 1) * step} on not judged)" if rest else "")
    return True, max((v[1] or 0.0 for v in verdicts), default=0.0), ""


def judge_outputs(fam: Family, case: Case, prepared: Prepared, files: Dict[str, list], threads: int = 1,
                  checks: Optional[dict] = None,
                  known: Optional[Dict[str, tuple]] = None) -> Tuple[bool, str, Optional[float], int]:
    """(correct, why, max error, outputs checked) over every output group the worker wrote: ``check`` (set 0, the
    checked call) and ``call<i>`` (a timed call: ``checks["calls"]`` gives its set and number, whose inputs the
    judge recomputes), then samples of drawn timed calls (``checks["samples"]``) and of pairs of timed calls whose
    samples agreed (``checks["repeats"]``), each on its calls' references. With
    ``threads`` > 1 the groups are judged that many at a time where memory allows (NumPy releases the GIL in its
    loops: the references the judge computes itself are most of its time); the verdict is that of the first
    failing group in this order either way. ``known``: tag -> verdict of groups judged already (the checked call,
    judged while the worker timed), taken as they are."""
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
        if known and tag in known:
            return known[tag]
        listed = files[tag]
        k, (arrays, grads), expected = inputs_of(tag)
        if expected is None:
            verdict = judge_by_rows(fam, case, arrays, grads, listed, prepared.folder, max(1, threads // at_once))
            if verdict is not None:
                ok, err, why = verdict
                if ok:
                    return True, "", err, 1
                return False, f"{where(tag)}, output 0: {why}", err, 1
            expected = expected_outputs(fam, case, arrays, grads)
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
    at_once = budget.judge_threads(case, len(tags), threads)
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
    positions = [np.asarray(p, dtype=np.int64) for p in entry["positions"]]
    for k, number in reversed(calls):
        for i, (dtype, sample, exp) in enumerate(zip(entry["dtypes"], entry["samples"],
                                                     sampled_expected(fam, case, prepared, k, number, positions))):
            got = host_values(np.frombuffer(bytes.fromhex(sample), _sample_dtype(dtype)), dtype)
            ok, _, why = judge(got, dtype, exp)
            if ok:
                continue
            if len(calls) == 1:
                return False, f"timed call {fresh.call_label(number)} on input set {k}, output {i} (sampled): {why}"
            (k1, n1), (k2, n2) = calls
            return False, (f"timed calls {fresh.call_label(n1)} (set {k1}) and {fresh.call_label(n2)} (set {k2}) on "
                           f"different inputs gave the same samples of output {i}, wrong for call "
                           f"{fresh.call_label(number)}: {why}")
    return True, ""


def sampled_expected(fam: Family, case: Case, prepared: Prepared, k: int, number: int, positions) -> list:
    """What call ``number`` on set ``k`` must give at ``positions`` (per output): the family's references of
    those elements where it computes them (``Family.expected_at``: a max_pool3d backward's, ~1 s whole), else
    its whole references there."""
    arrays, grads = prepared.sets[k]
    at = fam.expected_at(case, arrays, grads if case.direction == "bwd" else None, positions,
                         prepared.varied_at(case, k, number))
    if at is not None:
        return at
    arrays, grads = prepared.call_inputs(fam, case, k, number)
    return [e.take(p) for e, p in zip(expected_outputs(fam, case, arrays, grads), positions)]


def _sample_dtype(dtype: str):
    """The NumPy dtype the worker's samples of a ``dtype`` output are in (bfloat16: its bits)."""
    return np.uint16 if dtype == "bfloat16" else np.dtype("bool" if dtype == "bool" else dtype)

