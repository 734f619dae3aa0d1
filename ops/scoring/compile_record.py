"""What the compile pass remembers between runs, in JSON files in jittor's kernel folder (``<cache_path>/jit``):
the cases whose graphs a finished pass built, under a fingerprint of the code that builds them
(``COMPILED_FILE``), and kernels that did not compile (``FAILED_COMPILES_FILE``).

No jittor here: the grader's parent reads the record to skip the pass's worker, and it never imports jittor.
The worker passes jittor's own folder and version (``ops.scoring.compile_pass``); the parent finds them from
``jittor_utils`` (``kernel_folder``, ``jittor_version``).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import time
from typing import List, Optional, Sequence

FAILED_COMPILES_FILE = "ops_grader_failed_compiles.json"
COMPILED_FILE = "ops_grader_compiled.json"
# The implementations whose graphs the pass builds: the graded module's and the references jittor runs. A run that
# times no reference (a class child graded against stored tiers) builds ours alone.
PASS_IMPLS = ("ours", "naive", "jittor")


def load(folder: str, name: str) -> dict:
    try:
        with open(os.path.join(folder, name)) as f:
            known = json.load(f)
        return known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        return {}


def add(folder: str, name: str, key: str, value) -> None:
    known = load(folder, name)
    known[key] = value
    path = os.path.join(folder, name)
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(known, f, indent=1, sort_keys=True)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # a cache folder we cannot write: the work is redone next run, nothing worse


def code_fingerprint(jittor_version: str, name: str, module_file: str) -> str:
    """jittor's version and every source file of the graded module (``name``, its file or package's
    ``__init__.py`` ``module_file``; "" for none), of this package and of its snippets: what decides which kernels
    a case's graphs compile."""
    from .. import _codegen
    roots = {os.path.dirname(os.path.dirname(os.path.abspath(__file__))), str(_codegen.snippet_dir())}
    module_file = os.path.abspath(module_file) if module_file else ""
    if module_file:
        roots.add(os.path.dirname(module_file) if module_file.endswith("__init__.py") else module_file)
    h = hashlib.sha256(f"{jittor_version}\n{name}\n".encode())
    for root in sorted(roots):
        files = [root] if os.path.isfile(root) else sorted(
            os.path.join(d, f) for d, _, names in os.walk(root) for f in names if f.endswith((".py", ".cuh", ".h")))
        for path in files:
            h.update(path.encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:24]


def pass_names(references: Optional[Sequence[str]]) -> List[str]:
    """The implementations a run with ``references`` (None: all) builds in the pass."""
    refs = PASS_IMPLS if references is None else references
    return [n for n in PASS_IMPLS if n == "ours" or n in refs]


def _record_key(code: str, names: Sequence[str]) -> str:
    return code if set(names) >= set(PASS_IMPLS) else code + "/" + "+".join(sorted(set(names)))


def compiled_cases(folder: str, code: str, names: Sequence[str] = PASS_IMPLS) -> set:
    """Ids of the cases whose graphs of ``names`` (or more) a finished pass built under the code fingerprint
    ``code``."""
    found = set()
    for key, kept in load(folder, COMPILED_FILE).items():
        base, _, built = key.partition("/")
        if base == code and set(built.split("+") if built else PASS_IMPLS) >= set(names) and \
                isinstance(kept, dict) and isinstance(kept.get("cases"), list):
            found |= set(kept["cases"])
    return found


def remember_compiled(folder: str, code: str, case_ids: Sequence[str], names: Sequence[str] = PASS_IMPLS) -> None:
    key = _record_key(code, names)
    kept = load(folder, COMPILED_FILE).get(key)
    before = set(kept["cases"]) if isinstance(kept, dict) and isinstance(kept.get("cases"), list) else set()
    add(folder, COMPILED_FILE, key, {"cases": sorted(before | set(case_ids)), "date": time.strftime("%Y-%m-%d %H:%M")})


def jittor_version() -> str:
    """jittor's ``__version__``, read from its source (``jittor_utils``: jittor itself not imported)."""
    import jittor_utils
    return jittor_utils.get_jittor_version()


def kernel_folder(device: str) -> Optional[str]:
    """jittor's kernel folder for ``device``, found without importing jittor: the cache root of ``jittor_utils``
    for the CPU build; for CUDA, of its ``cu<nvcc version>_sm_<archs>`` folders (one per nvcc and set of GPUs
    jittor has met), the one whose record a pass wrote last. None where there is no record yet. A wrong pick
    costs time only: the pass's worker then starts and finds what is built."""
    import jittor_utils
    root = jittor_utils.cache_path
    if device != "cuda":
        return os.path.join(root, "jit")
    records = glob.glob(os.path.join(glob.escape(root), "cu*", "jit", COMPILED_FILE))
    return os.path.dirname(max(records, key=os.path.getmtime)) if records else None
