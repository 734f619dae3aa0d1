"""A case's inputs, made in the parent: the check set (reproducible with ``--seed``) and fresh sets for the timed
calls, written as .npy files to a folder under /dev/shm (or the system's temporary folder) for the worker to load,
kept here (with the check set's float64 references where they are computed in advance) for the judge."""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Tuple

import numpy as np

from . import fresh, spare
from .spec import Case, Family

# Cases whose inputs (as float64) are at most this time 3 sets of fresh values beside the check set; larger
# ones time the check set and one fresh set in turn: 2 sets to make and load instead of 3 (and as many outputs
# handed back: the check call's and one per timed set). On an H100 run (2026-11-27) loading the sets cost the
# worker 45 s and their preparations the parent 140 s, most of it on these cases. Two sets in turn still give
# every timed call a different buffer than the call before, and the fresh one fails a module that replays
# answers of a seeded run.
SMALL_CASE_BYTES = 64 << 20
# References computed in advance hold at most this much at once (one case ahead, one being judged): a host with
# 32 GB of memory still runs the largest cases, whose references the judge then computes set by set.
EAGER_REFERENCE_BYTES = 4 << 30


def scratch_root() -> str:
    """/dev/shm where it exists (the inputs and outputs never touch a disk), else the temporary folder."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def fresh_seed() -> int:
    """A seed no one can guess: a run's, unless --seed gives one."""
    return int(np.random.SeedSequence().entropy) % (1 << 63)


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
        varied, keys = self._varied(case, k)
        varied = [fresh.flip_numpy(a, _case_dtype(case, a), key, number) for a, key in zip(varied, keys)]
        return (varied, list(grads)) if case.direction == "fwd" else (list(arrays), varied)

    def _varied(self, case: Case, k: int):
        """The arrays of set ``k`` that every call varies (a forward's inputs, a backward's output gradients),
        and their keys (``fresh.input_keys``)."""
        arrays, grads = self.sets[k]
        varied = list(arrays if case.direction == "fwd" else grads)
        return varied, fresh.input_keys(self.seed, 0, len(varied))

    def varied_at(self, case: Case, k: int, number: int):
        """``at(i, idx)``: the values at flat positions ``idx`` of the ``i``-th array call ``number`` on set ``k``
        varies (what ``call_inputs`` would give there, without flipping whole arrays)."""
        varied, keys = self._varied(case, k)

        def at(i: int, idx: np.ndarray) -> np.ndarray:
            return fresh.flip_at(varied[i], _case_dtype(case, varied[i]), keys[i], number, idx)

        return at


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
        expected = expected_outputs(fam, case, arrays, grads) if eager and k == 0 and \
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


def expected_outputs(fam: Family, case: Case, arrays, grads) -> list:
    """The family's Expected outputs (float64 references) for these inputs and output gradients."""
    return fam.expected(case, arrays, grads if case.direction == "bwd" else None)

