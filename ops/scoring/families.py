"""All operator families of the case table, in report order (``ops/registry.py``: each record's ``grader``)."""
from typing import List, Optional, Sequence

from .. import registry
from .spec import Case, Family, family_cases


def load_families(names: Optional[Sequence[str]] = None) -> List[Family]:
    """The families' adapters; ``names`` filters by family name (e.g. ``["max_pool3d"]``)."""
    fams = [r.grader_family() for r in registry.families() if r.grader]
    if names:
        unknown = set(names) - {f.name for f in fams}
        if unknown:
            raise ValueError(f"unknown op family {sorted(unknown)}; known: {[f.name for f in fams]}")
        fams = [f for f in fams if f.name in names]
    return fams


def all_cases(device: Optional[str] = None) -> List[Case]:
    return family_cases(load_families(), device)
