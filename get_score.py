#!/usr/bin/env python3
"""Score every operator case on this machine's GPU (or its CPU): correctness, time per call, tier points.

    python get_score.py                      # all cases, default device, table on stdout
    python get_score.py --op max_pool3d -k k2 --markdown scores/h100.md --compile
    python get_score.py --impl my_ops        # grade another module exposing ops' functions

See ``python get_score.py --help`` and README.md.
"""
import importlib.util
import os
import sys


def _parse(argv=None, prog="get_score.py"):
    """Parse the arguments before anything imports jittor (importing ``ops`` does): --help and mistakes
    answer at once, even where jittor's core is not built yet."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops", "scoring", "args.py")
    spec = importlib.util.spec_from_file_location("_get_score_args", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_args(argv, prog=prog)


def run(argv=None, prog="ops-get-score"):
    """The grader's command (``python get_score.py``, and ``ops-get-score`` where the package is installed)."""
    parsed = _parse(argv, prog)
    # This process makes inputs and judges outputs; only its workers need jittor (ops/__init__.py)
    os.environ["OPS_GRADER_PARENT"] = "1"
    from ops.scoring.cli import main
    return main(parsed=parsed)


if __name__ == "__main__":
    sys.exit(run(prog="get_score.py"))
