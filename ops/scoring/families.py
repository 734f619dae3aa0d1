"""All operator families of the case table, in report order."""
import importlib
import os
from typing import List, Optional, Sequence

from .args import FAMILY_MODULES_ENV  # comma-separated modules, each defining FAMILY, to grade instead of the
from .spec import Case, Family, family_cases  # built-in table (a course's own cases, the tests' toy family)

FAMILY_MODULES = ("fam_pool3d", "fam_permute", "fam_broadcast", "fam_timex")


def _modules():
    extra = os.environ.get(FAMILY_MODULES_ENV)
    if extra:
        return [importlib.import_module(m.strip()) for m in extra.split(",") if m.strip()]
    return [importlib.import_module(f".{m}", __package__) for m in FAMILY_MODULES]


def load_families(names: Optional[Sequence[str]] = None) -> List[Family]:
    """The families' adapters; ``names`` filters by family name (e.g. ``["max_pool3d"]``)."""
    fams = [m.FAMILY for m in _modules()]
    if names:
        unknown = set(names) - {f.name for f in fams}
        if unknown:
            raise ValueError(f"unknown op family {sorted(unknown)}; known: {[f.name for f in fams]}")
        fams = [f for f in fams if f.name in names]
    return fams


def all_cases(device: Optional[str] = None) -> List[Case]:
    return family_cases(load_families(), device)
