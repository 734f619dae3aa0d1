"""Loaded at start-up by processes that have this folder on PYTHONPATH (tests/test_classroom.py): in a grader
parent (``OPS_GRADER_PARENT`` set in its environment) every import of jittor fails. Its workers start without
the variable and import jittor as usual."""
import os
import sys

if os.environ.get("OPS_GRADER_PARENT") == "1":
    class _NoJittor:
        def find_spec(self, name, path=None, target=None):
            if name in ("jittor", "jittor_core") or name.startswith("jittor."):
                raise ImportError(f"a grader parent imported {name}")
            return None

    sys.meta_path.insert(0, _NoJittor())
