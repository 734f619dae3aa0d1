"""The declarative case table's vocabulary: ``Case`` and the ``Family`` adapter each operator family fills in.

A family module (``ops/scoring/fam_<op>.py``) defines ``FAMILY``: its cases and how to make inputs, compute
float64 references and call each implementation. Backward cases need no code of their own: the harness
differentiates the family's forward with a given output gradient (see ``ops.scoring.harness``).
The tests import the same tables.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .judge import Expected

Shape = Tuple[int, ...]

# Default per-dtype tolerances (rtol, atol) for a result compared with its float64 reference. Families with
# long reductions override ``Family.tolerance``.
DEFAULT_TOLERANCE = {
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (1e-3, 1e-4),
    "bfloat16": (8e-3, 1e-3),
    **{t: (0.0, 0.0) for t in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                               "uint64")},  # exact
}


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    direction: str  # "fwd" or "bwd"
    shapes: Tuple[Shape, ...]  # forward input shapes
    dtype: str
    params: Tuple[Tuple[str, object], ...] = ()
    devices: Tuple[str, ...] = ("cuda",)  # "cuda": GPU-sized; "cpu": sized for the CPU path
    grad_of: Tuple[int, ...] = (0,)  # inputs differentiated by a backward case

    def __post_init__(self):
        if self.direction not in ("fwd", "bwd"):
            raise ValueError(f"direction must be 'fwd' or 'bwd', got {self.direction!r}")

    @property
    def id(self) -> str:
        return f"{self.family}/{self.direction}/{self.name}"

    @property
    def p(self) -> Dict[str, object]:
        return dict(self.params)


def case(family, name, direction, shapes, dtype, devices=("cuda",), grad_of=(0,), **params) -> Case:
    """Shorthand constructor: parameters as keywords."""
    return Case(family, name, direction, tuple(tuple(s) for s in shapes), dtype,
                tuple(sorted(params.items())), tuple(devices), tuple(grad_of))


# Float arrays of at least this many elements are drawn in blocks by up to DRAW_THREADS threads, each block from
# its own generator seeded from ``rng`` (so still reproducible with --seed): one thread took ~3.5 s to draw and
# round one 280M-element bfloat16 input on an H100 host, and the largest cases have three per input set.
PARALLEL_DRAW_ELEMENTS = 1 << 23
DRAW_THREADS = min(8, os.cpu_count() or 1)


def random_array(shape: Shape, dtype: str, rng: np.random.Generator, low=-1.0, high=1.0) -> np.ndarray:
    """Fresh random data of ``dtype``, returned as a NumPy array that holds exactly the values the op sees.

    Floats are uniform in [low, high) rounded to the dtype (bfloat16 values are carried as float32); ints
    span a small range that includes negatives; bool is a fair coin.
    """
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int") or dtype.startswith("uint"):
        info = np.iinfo(np.dtype(dtype))
        lo, hi = max(info.min, -1000), min(info.max, 1000)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    if dtype == "float64":
        return rng.uniform(low, high, size=shape)
    # narrower floats: drawn in float32 (2.4x faster than float64 then a cast for 25M values; the grader's
    # largest inputs take seconds of host time per case otherwise)
    out = np.empty(shape, np.float32 if dtype == "bfloat16" else np.dtype(dtype))
    flat = out.reshape(-1)
    in_place = flat.dtype == np.float32  # float32 and bfloat16 (carried as float32): drawn into the output

    def fill(gen, block):
        x = flat[block] if in_place else np.empty(block.stop - block.start, np.float32)
        gen.random(out=x, dtype=np.float32)
        x *= np.float32(high - low)
        x += np.float32(low)
        if dtype == "bfloat16":
            x[...] = round_to_bfloat16(x)
        elif not in_place:
            flat[block] = x

    _in_blocks(flat.size, rng, fill)
    return out


def _in_blocks(size: int, rng: np.random.Generator, fill: Callable[[np.random.Generator, slice], None]) -> None:
    """``fill(generator, block)`` over a flat array of ``size`` elements: in one call with ``rng`` itself below
    PARALLEL_DRAW_ELEMENTS, else over blocks in threads, each with a generator seeded from ``rng``."""
    parts = max(1, min(DRAW_THREADS, size // PARALLEL_DRAW_ELEMENTS))
    if parts == 1:
        fill(rng, slice(0, size))
        return
    gens = [np.random.default_rng(int(s)) for s in rng.integers(0, 2**63, size=parts)]
    step = -(-size // parts)
    with ThreadPoolExecutor(parts) as pool:
        list(pool.map(lambda k: fill(gens[k], slice(k * step, min(size, (k + 1) * step))), range(parts)))


def round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept in float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = bits >> np.uint32(16)  # in place from here: one temporary (a 280M-element array: 0.7 -> 0.2 s)
    rounded &= np.uint32(1)
    rounded += np.uint32(0x7FFF)
    rounded += bits
    rounded &= np.uint32(0xFFFF0000)
    out = rounded.view(np.float32)
    nan = np.isnan(x)
    if nan.any():  # a NaN's payload plus the rounding could carry into the sign: NaN stays NaN as it was
        out[nan] = x[nan]
    return out


def edge_array(shape: Shape, dtype: str, rng: np.random.Generator, density: float = 0.02) -> np.ndarray:
    """Inputs that exercise semantics: integer-valued floats in [-4, 4] (ties everywhere, +0.0 among them),
    with NaN, +Inf, -Inf and -0.0 each at about ``density`` of the places (at least one of each where the
    array has room). Integer and bool dtypes: ``random_array`` (their small ranges tie already)."""
    if dtype == "bool" or not (dtype.startswith("float") or dtype == "bfloat16"):
        return random_array(shape, dtype, rng)
    x = np.empty(shape, np.float64 if dtype == "float64" else np.float32)
    flat = x.reshape(-1)

    def fill(gen, block):
        flat[block] = gen.integers(-4, 5, size=block.stop - block.start)

    _in_blocks(flat.size, rng, fill)
    count = max(1, int(round(density * flat.size))) if flat.size >= 8 else 0
    if flat.size < PARALLEL_DRAW_ELEMENTS:
        places = rng.permutation(flat.size)[:4 * count]
    else:  # a permutation of 67M places took ~3 s; drawn places may repeat, which leaves each value ~density
        places = rng.integers(0, flat.size, size=4 * count)
    for j, v in enumerate((np.nan, np.inf, -np.inf, -0.0)):
        flat[places[j * count:(j + 1) * count]] = v
    if dtype in ("float16",):
        return x.astype(np.float16)
    return x  # bfloat16 carried as float32: every value above is a bfloat16


EDGE = "edge"  # the ``values`` parameter of a case whose inputs come from ``edge_array``


def is_edge(c: "Case") -> bool:
    return c.p.get("values") == EDGE


@dataclass(frozen=True)
class KnownCompileFailure:
    """A compile failure that is a property of an implementation and dtype, not of a shape: ``probe``, a small
    case, fails to compile with ``marker`` in the compiler's output exactly where every case of ``keys``
    (compile keys, ``compile_key``) would."""

    probe: Case
    keys: Tuple[str, ...]
    marker: str
    why: str  # one line for the table: what the bug is


class ReferenceSkipped(Exception):
    """Raised by a family's reference to say it is deliberately not timed for this case (the message says
    why); the table shows "skipped: <why>" instead of an error."""


@dataclass
class Family:
    """What the grader and the tests need to know about one operator family.

    Subclasses override the methods; ``cases`` is the family's part of the declarative table.
    """

    name: str
    cases: List[Case] = field(default_factory=list)
    # Cases whose inputs hold ties, NaN, +-Inf and -0.0 (``edge_array``), graded like the others. Kept out of
    # ``cases``, which the operator test files replay with assert_allclose on random data.
    edge_cases: List[Case] = field(default_factory=list)

    def all_cases(self) -> List[Case]:
        return list(self.cases) + list(self.edge_cases)

    # --- inputs and references -------------------------------------------------------------------------
    def make_inputs(self, case: Case, rng: np.random.Generator) -> List[np.ndarray]:
        if is_edge(case):
            return [edge_array(s, case.dtype, rng, self.edge_density(case)) for s in case.shapes]
        return [random_array(s, case.dtype, rng) for s in case.shapes]

    def zero_inputs(self, case: Case) -> Tuple[List[np.ndarray], List[np.ndarray]]:
        """(inputs, output gradients of a backward case) of the right shapes and NumPy dtypes, holding zeros
        (``np.zeros``: no memory touched until read): the shapes and dtypes the compile pass builds on."""
        def zeros(shape):
            return np.zeros(shape, np.float32 if case.dtype == "bfloat16" else np.dtype(case.dtype))
        grads = [zeros(s) for s in self.output_shapes(case)] if case.direction == "bwd" else []
        return [zeros(s) for s in case.shapes], grads

    def output_shapes(self, case: Case) -> List[Shape]:
        """Shapes of the forward's outputs (the output gradients of a backward case have these)."""
        arrays = [np.zeros(s, dtype=np.float32) for s in case.shapes]
        return [tuple(np.shape(o)) for o in self.reference_forward(case, arrays)]

    def edge_density(self, case: Case) -> float:
        """How often each special value (NaN, +Inf, -Inf, -0.0) appears in an edge case's arrays."""
        return 0.02

    def make_grads(self, case: Case, rng: np.random.Generator) -> List[np.ndarray]:
        """The output gradients a backward case injects: random in the case dtype (``edge_array`` for edge
        cases)."""
        if is_edge(case):
            return [edge_array(s, case.dtype, rng, self.edge_density(case)) for s in self.output_shapes(case)]
        return [random_array(s, case.dtype, rng) for s in self.output_shapes(case)]

    def expected(self, case: Case, arrays: Sequence[np.ndarray],
                 grads_out: Optional[Sequence[np.ndarray]] = None) -> List[Expected]:
        """What each output (forward) or gradient (backward) must be. The default: the reference, exact for
        integer and bool results, within ``tolerance`` (rtol, atol) per element for floats. Families
        override it with exact comparisons and per-element bounds."""
        if case.direction == "fwd":
            wants = self.reference_forward(case, arrays)
        else:
            wants = self.reference_backward(case, arrays, grads_out)
        rtol, atol = self.tolerance(case)
        out = []
        for w in wants:
            w = np.asarray(w)
            if w.dtype.kind in "fc":
                out.append(Expected(w.astype(np.float64), (case.dtype,), "rounded",
                                    atol + rtol * np.abs(np.where(np.isfinite(w), w, 0.0))))
            else:
                out.append(Expected(w, (str(w.dtype),)))
        return out

    def expected_at(self, case: Case, arrays: Sequence[np.ndarray], grads_out: Optional[Sequence[np.ndarray]],
                    positions: Sequence[np.ndarray], varied_at: Callable[[int, np.ndarray], np.ndarray]
                    ) -> Optional[List[Expected]]:
        """What each output must be at its flat ``positions`` only (1-D expectations), for a call whose varied
        arrays (a forward's inputs, a backward's output gradients) ``varied_at(i, flat_idx)`` reads where needed
        (``arrays``, ``grads_out``: the call's input set, unvaried). None: the family computes whole references
        (the default); a family whose whole reference is costly computes these few elements instead."""
        return None

    def expected_rows(self, case: Case, arrays: Sequence[np.ndarray], grads_out: Optional[Sequence[np.ndarray]]
                      ) -> Optional[Tuple[int, Callable[[slice], Expected]]]:
        """For a case with a single output: (its length along the first axis, a function giving what a block of
        rows of it must be, computed from those rows alone); None (the default) where the family does not
        compute blocks of rows on their own. The judge of a case too large to have its references made in
        advance judges such a case block by block, in parallel."""
        return None

    def judged_in_rows(self, case: Case) -> bool:
        """Does ``expected_rows`` give blocks of rows for this case (the parent then never holds its whole float64
        references: what its memory footprint counts)? Must agree with ``expected_rows``."""
        return False

    def reference_forward(self, case: Case, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """float64 outputs of the op on ``arrays``."""
        raise NotImplementedError

    def reference_backward(self, case: Case, arrays: Sequence[np.ndarray],
                           grads_out: Sequence[np.ndarray]) -> List[np.ndarray]:
        """float64 gradients w.r.t. ``arrays[i]`` for i in ``case.grad_of``, given output gradients."""
        raise NotImplementedError

    def tolerance(self, case: Case) -> Tuple[float, float]:
        return DEFAULT_TOLERANCE[case.dtype]

    # --- implementations: each returns a list of output Vars / tensors --------------------------------
    def forward(self, case: Case, api, xs) -> list:
        """Our (or a graded module's) forward through its public functions; ``api`` is the module."""
        raise NotImplementedError

    def naive_forward(self, case: Case, xs) -> list:
        """A plain jittor composite (reindex/reduce, broadcast, ...), the first tier."""
        raise NotImplementedError

    def jittor_forward(self, case: Case, xs) -> Optional[list]:
        """jittor's built-in op; raise or return None where there is none, raise ``ReferenceSkipped`` where
        timing it would cost more than the case is worth."""
        return None

    def torch_forward(self, case: Case, ts) -> Optional[list]:
        """PyTorch eager on torch tensors; None where there is no counterpart."""
        return None

    def known_compile_failures(self) -> List["KnownCompileFailure"]:
        """Known bugs that keep this family's reference kernels from compiling somewhere: the compile pass
        probes each with one small graph and, where it fails as described, skips the keys it names."""
        return []

    # --- cost model -------------------------------------------------------------------------------------
    def bytes_moved(self, case: Case) -> int:
        """The fewest bytes the case must move: each input read once, each output written once."""
        raise NotImplementedError

    def flops(self, case: Case) -> Optional[int]:
        return None

    def variant(self, case: Case, api) -> str:
        """The kernel variant ``api``'s dispatcher picks for this case ('-' when it cannot say)."""
        return "-"

    # A family with CUDA cases defines ``cuda_launches(case)``: the kernels a GPU case compiles (counted by
    # tests/test_compiles.py) as (launch, its inputs' (dtype, rank), whether its grad sources run too), the
    # forward under no_grad for a forward case as the grader times it, and for a backward case the forward with
    # grad and every launch of the backward.
    cuda_launches = None


def family_cases(families: Sequence[Family], device: Optional[str] = None) -> List[Case]:
    out = []
    for fam in families:
        out.extend(c for c in fam.all_cases() if device is None or device in c.devices)
    return out
