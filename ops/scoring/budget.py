"""What the parent does at once on a GPU host, as far as memory allows: cases prepared ahead, cases judged while
the worker runs the next, output groups and blocks of rows judged in parallel, spare files kept."""
from __future__ import annotations

import os

import numpy as np

from .args import allowed_cpus
from .prepare import input_sets
from .spec import Case, Family

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
# On a GPU host: finished cases judged at once while the worker runs the next (an H100 run's worker waited for
# judges 31 s of 185 s with 3, 20 s of 159 s with 5; 2026-11-27).
JUDGES = 5
DESIGN_CORES = 16  # the host the counts above were set on: fewer cores (a class child's share) scale them down
SPARE_BYTES = 8 << 30  # at most (and at most 1/16 of the free memory): judged cases' files kept as spares

# Bytes a judge of one set holds per input element (float64 reference values and bounds, the verdict's float64
# temporaries): what decides how many sets are judged at once.
JUDGE_BYTES_PER_ELEMENT = 48


def scaled(count: int) -> int:
    """``count`` threads of a DESIGN_CORES host, in proportion on a process allowed fewer cores (at least 1)."""
    return max(1, count * min(len(allowed_cpus()), DESIGN_CORES) // DESIGN_CORES)


def available_memory() -> int:
    """Bytes of free physical memory (0 where the system does not say)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def judge_threads(case: Case, groups: int, threads: int) -> int:
    """How many output groups to judge at once: up to ``threads``, as many as half the free memory holds."""
    per_group = JUDGE_BYTES_PER_ELEMENT * sum(int(np.prod(s)) for s in case.shapes)
    fits = available_memory() // 2 // max(per_group, 1)
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
    return max(4 << 30, available_memory() // 3)


def spare_limit() -> int:
    """Bytes of judged cases' files kept as spares for the next writers (``ops.scoring.spare``)."""
    return min(SPARE_BYTES, available_memory() // 16)
