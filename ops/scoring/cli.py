"""Command line of get_score.py: choose cases and references, run, grade, report."""
from __future__ import annotations

import argparse
import datetime
import sys
from typing import List, Optional

from . import report
from .families import load_families
from .grading import CaseResult
from .runner import DEFAULT_TIMEOUT_S, Interrupted, grade_all, run_cases, warm_compile


def parse_args(argv: Optional[List[str]] = None):
    ap = argparse.ArgumentParser(
        prog="get_score.py",
        description="Score every operator case: correctness against float64 references, kernel throughput "
                    "against the naive jittor composite, jittor's built-in and PyTorch, tier points.")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="default: cuda where jittor has CUDA, else cpu (CPU-sized cases)")
    ap.add_argument("--op", action="append", default=None, metavar="FAMILY",
                    help="only this op family (max_pool3d, permute, expand_as, timex); repeatable")
    ap.add_argument("-k", dest="keyword", default=None,
                    help="only cases whose id contains this substring (several: comma-separated, any one matches)")
    ap.add_argument("--direction", choices=("fwd", "bwd"), default=None, help="only forward or backward cases")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch references")
    ap.add_argument("--impl", default="ops", help="module to grade, exposing ops' functions (default: ops)")
    ap.add_argument("--tiers", metavar="F", help="grade against tiers stored in F (from --save-tiers)")
    ap.add_argument("--save-tiers", metavar="F", help="write this run's tiers to F")
    ap.add_argument("--markdown", metavar="F", help="also write the table as markdown to F")
    ap.add_argument("--json", metavar="F", help="also write all results as JSON to F")
    ap.add_argument("--plot", metavar="F.png", help="also draw the speedup chart (needs matplotlib)")
    ap.add_argument("--seed", type=int, default=None, help="input seed (default: fresh)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per case before 'hung'")
    ap.add_argument("--repeats", type=int, default=5, help="timed measurements per implementation (median)")
    ap.add_argument("--budget", type=float, default=None, metavar="S",
                    help="start no case after S seconds; the rest are reported as not run (0 points)")
    ap.add_argument("--no-warm", action="store_true", help="skip the parallel kernel-compile pass (GPU)")
    ap.add_argument("--from-json", nargs="+", metavar="F", default=None,
                    help="run nothing: merge the results saved by earlier --json runs (later files win, a "
                         "measured case beats one not run) and report them, e.g. one run per --op")
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap.parse_args(argv)


def _matches(case_id: str, keyword: Optional[str]) -> bool:
    """-k: no filter, or any of the comma-separated substrings occurs in the case id."""
    return keyword is None or any(k and k in case_id for k in keyword.split(","))


def _torch_importable() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def merge_saved(paths: List[str]):
    """(env, references, results) merged from files written by --json; later files win per case, except
    that a measured case is never replaced by one that was not run. Bytes moved come from the families'
    current models (a corrected model applies to older runs too), the saved count for a case no longer listed."""
    import json

    from .runner import _result_from_json
    env, references, merged, order = {}, [], {}, []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for k, v in data.get("env", {}).items():
            env.setdefault(k, v)
        for ref in data.get("meta", {}).get("references", []):
            if ref not in references:
                references.append(ref)
        for d in data["results"]:
            res = _result_from_json(d)
            old = merged.get(res.case_id)
            if old is None:
                order.append(res.case_id)
            if old is None or not res.why.startswith("not run"):
                merged[res.case_id] = res
    model = {c.id: f.bytes_moved(c) for f in load_families() for c in f.cases}
    for res in merged.values():
        res.nbytes = model.get(res.case_id, res.nbytes)
    return env, references, [merged[c] for c in order]


def _write_outputs(args, results, references, env, meta, title):
    print(report.render(results, references, env, markdown=False))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.render(results, references, env, markdown=True, title=title))
            f.write(f"\nCommand: `python get_score.py {' '.join(map(str, meta['argv']))}` (seed {meta['seed']}; "
                    f"tiers: {meta['tiers']}). Times are median kernel times in ms; GB/s counts the fewest bytes "
                    f"the case must move; %roof is that over the copy bandwidth measured in the same run.\n")
    if args.json:
        with open(args.json, "w") as f:
            f.write(report.to_json(results, env, meta))
    if args.save_tiers:
        report.save_tiers(args.save_tiers, results, env)
    if args.plot:
        report.plot(args.plot, results, references)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    import random

    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    if args.from_json:
        env, references, results = merge_saved(args.from_json)
        grade_all(results, report.load_tiers(args.tiers) if args.tiers else None)
        meta = {"date": stamp, "argv": sys.argv[1:] if argv is None else argv, "seed": "as saved",
                "impl": args.impl, "references": references, "tiers": args.tiers or "as measured",
                "merged_from": args.from_json}
        _write_outputs(args, results, references, env, meta,
                       f"get_score.py results merged from {len(args.from_json)} run(s), {stamp}")
        return 0

    import signal

    from .. import has_cuda
    # jittor's core installs a SIGCHLD handler that exits this process when any child dies; here children
    # are grading workers, and one killed for hanging must not take the grader down with it.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)

    # `timeout` (or Ctrl-C) stops the run, not the report: the cases measured so far are written out and
    # the rest are marked not run.
    def stop(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    device = args.device or ("cuda" if has_cuda() else "cpu")
    if device == "cuda" and not has_cuda():
        print("get_score.py: --device cuda, but jittor has no CUDA here", file=sys.stderr)
        return 2
    families = load_families(args.op)
    cases = [c for f in families for c in f.cases if device in c.devices
             and _matches(c.id, args.keyword)
             and (args.direction is None or c.direction == args.direction)]
    if args.list:
        print("\n".join(c.id for c in cases))
        return 0
    if not cases:
        print("get_score.py: no case matches", file=sys.stderr)
        return 2
    references = ["naive", "jittor"]
    if not args.no_torch and _torch_importable():
        references.append("torch")
        if args.compile:
            references.append("compile")
    stored = report.load_tiers(args.tiers) if args.tiers else None
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    nbytes = {c.id: f.bytes_moved(c) for f in families for c in f.cases}

    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(cases), desc="scoring", unit="case", file=sys.stderr)
        except ImportError:
            bar = None

    def progress(res):
        line = f"{res.case_id}: {'ok' if res.correct else 'FAIL ' + res.why} ours={res.ours.ms} " + " ".join(
            f"{k}={v.ms if v.ok else 'ERR'}" for k, v in res.refs.items())
        if res.seconds is not None:
            line += f" ({res.seconds:.1f} s)"
        print(line, file=sys.stderr, flush=True)  # a record even if the run is cut short
        if bar is not None:
            bar.set_postfix_str(res.case_id[-40:])
            bar.update(1)

    import time
    deadline = time.monotonic() + args.budget if args.budget is not None else None
    by_family = {}
    for c in cases:
        by_family.setdefault(c.family, []).append(c.id)
    lanes = list(by_family.values())
    warm_stop = None
    if device == "cuda" and not args.no_warm:
        print(f"compiling kernels of {len(cases)} cases ({len(lanes)} families in parallel)...", file=sys.stderr)
        try:
            warm_compile(lanes, device=device, impl=args.impl, seed=seed,
                         timeout_s=args.budget / 2 if args.budget is not None else 900)
        except Interrupted as why:
            warm_stop = why
    # Run the families' cases interleaved, so that a --budget cut-off leaves every family partly covered.
    run_order = [lane[i] for i in range(max(map(len, lanes))) for lane in lanes if i < len(lane)]
    if warm_stop is None:
        env, results = run_cases(run_order, device=device, impl=args.impl, seed=seed,
                                 references=references, timeout_s=args.timeout, on_result=progress,
                                 nbytes_of=nbytes.get, deadline=deadline, repeats=args.repeats)
    else:
        env = {}
        results = [CaseResult(cid, nbytes[cid], why=f"not run: interrupted ({warm_stop})") for cid in run_order]
    if bar is not None:
        bar.close()
    by_id = {r.case_id: r for r in results}
    results = [by_id[c.id] for c in cases]
    grade_all(results, stored)

    title = f"get_score.py on {env.get('name', device)}, {stamp}"
    meta = {"date": stamp, "argv": sys.argv[1:] if argv is None else argv, "seed": seed, "impl": args.impl,
            "references": references, "tiers": args.tiers or "this run"}
    _write_outputs(args, results, references, env, meta, title)
    return 0
