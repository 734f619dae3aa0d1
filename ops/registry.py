"""The operator families, one record each: the one list that ``ops`` (its exports), the grader's family list
(``ops/scoring/families.py``), the recorded test calls (``tests/call_record.py``), the compile-budget test
(``tests/test_compiles.py``) and the per-call bench (``ops/bench.py``) read.

Standard library only, and a record holds names, not objects: reading the records imports nothing (``import ops``
stays as cheap as its families' own modules, and the grader's case modules load only when a reader asks for them).
``get_score.py`` loads this file by its path to learn the family names before anything imports jittor.

``OPS_SCORING_FAMILY_MODULES`` (comma-separated module names) puts other families in place of the built-in ones
for the grader, the recorded calls, the compile-budget test and the bench (a course's own cases, the tests' toy
family): each module defines ``RECORD`` (a :class:`FamilyRecord`), or only ``FAMILY`` (the grader's cases, the
record then being its name and module). ``ops``' exports are always the built-in families'.
"""

import importlib
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

FAMILY_MODULES_ENV = "OPS_SCORING_FAMILY_MODULES"


@dataclass(frozen=True)
class FamilyRecord:
    """One operator family.

    ``name``: the grader's family name (``get_score.py --op``, the first part of a case id). ``module``: the
    implementation, whose ``functions`` and ``layers`` (jt.Module classes) ``ops`` exports and whose
    ``variants`` attributes name its kernel variants and menus. ``grader``: the module whose ``FAMILY`` holds the
    grader's cases; ``aliases``: the other functions ``--op`` takes, each with the ``op`` of the cases it selects
    (None: all). ``snippets``: its files in ``cuda_snippets/``. ``tests``: the test files whose CPU half is
    recorded for the CUDA warm-up (``tests/call_record.py``). ``bench``: ``"module:function"`` giving its rows of
    ``python -m ops.bench calls``.
    """
    name: str
    module: str
    functions: Tuple[str, ...]
    layers: Tuple[str, ...] = ()
    grader: str = ""
    aliases: Dict[str, Optional[str]] = field(default_factory=dict)
    variants: Tuple[str, ...] = ()
    snippets: Tuple[str, ...] = ()
    tests: Tuple[str, ...] = ()
    bench: str = ""

    def implementation(self):
        return importlib.import_module(self.module)

    def grader_family(self):
        """The grader's ``Family`` of this record (its cases and references)."""
        return importlib.import_module(self.grader).FAMILY

    def bench_calls(self) -> Optional[Callable]:
        """The function giving this family's bench rows, or None where it has none."""
        if not self.bench:
            return None
        module, name = self.bench.split(":")
        return getattr(importlib.import_module(module), name)


BUILTIN = (
    FamilyRecord("max_pool3d", "ops.pool3d", functions=("max_pool3d",), layers=("MaxPool3d",),
                 grader="ops.scoring.fam_pool3d", variants=("VARIANTS",),
                 snippets=("pool3d.cuh", "pool3d_gather.cuh", "pool3d_cpu.h"), tests=("test_pool3d.py",),
                 bench="ops.bench:pool3d_calls"),
    FamilyRecord("permute", "ops.permutation", functions=("permute", "transpose", "transpose_add"),
                 layers=("Permute", "TransposeAdd"), grader="ops.scoring.fam_permute",
                 aliases={"transpose": "permute", "transpose_add": "transpose_add"}, variants=("VARIANTS",),
                 snippets=("permute.cuh", "permute_cpu.h"), tests=("test_permute.py",),
                 bench="ops.bench:permute_calls"),
    FamilyRecord("expand_as", "ops.broadcast", functions=("broadcast_to", "expand_as"), layers=("ExpandAs",),
                 grader="ops.scoring.fam_broadcast", aliases={"broadcast_to": None},
                 variants=("FORWARD_VARIANTS", "GRAD_VARIANTS"), snippets=("broadcast.cuh", "broadcast_cpu.h"),
                 tests=("test_broadcast.py",), bench="ops.bench:broadcast_calls"),
    FamilyRecord("timex", "ops.time_mix", functions=("timex",), layers=("TimeX",), grader="ops.scoring.fam_timex",
                 variants=("VARIANTS",), snippets=("timex.cuh",), tests=("test_timex.py",),
                 bench="ops.bench:timex_calls"),
)


def _record_of(module) -> FamilyRecord:
    record = getattr(module, "RECORD", None)
    if record is not None:
        return record
    if not hasattr(module, "FAMILY"):
        raise ValueError(f"{FAMILY_MODULES_ENV}: module {module.__name__} defines neither RECORD nor FAMILY")
    return FamilyRecord(module.FAMILY.name, module.__name__, (), grader=module.__name__)


def families() -> List[FamilyRecord]:
    """The families in report order: those of ``OPS_SCORING_FAMILY_MODULES`` where it is set, else the built-in."""
    extra = os.environ.get(FAMILY_MODULES_ENV)
    if not extra:
        return list(BUILTIN)
    return [_record_of(importlib.import_module(m.strip())) for m in extra.split(",") if m.strip()]


def exports(records=BUILTIN) -> Dict[str, str]:
    """{public name: implementation module} of the records' functions and layers."""
    return {name: r.module for r in records for name in r.functions + r.layers}
