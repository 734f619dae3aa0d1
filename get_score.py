#!/usr/bin/env python3
"""Score every operator case on this machine's GPU (or its CPU): correctness, throughput, tier points.

    python get_score.py                      # all cases, default device, table on stdout
    python get_score.py --op max_pool3d -k k2 --markdown scores/h100.md --compile
    python get_score.py --impl my_ops        # grade another module exposing ops' functions

See ``python get_score.py --help`` and README.md.
"""
import sys

from ops.scoring.cli import main

if __name__ == "__main__":
    sys.exit(main())
