"""Command line of get_score.py: choose cases and references, run, grade, report.

The arguments are parsed (``ops.scoring.args``, standard library only) before this module is imported by
get_score.py, so that ``--help`` and argument errors never wait for jittor.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import tempfile
import threading
import time
from typing import List, Optional

from . import args as cli_args
from . import classroom
from . import report
from .compile_driver import warm_compile
from .families import load_families
from .grading import CaseResult, grade_all, result_from_json
from .isolation import Isolation, become_subreaper, descendants, reap, signal_on_parent_exit
from .prepare import fresh_seed, scratch_root
from .runner import Interrupted, run_cases
from .worker_proxy import PACKAGE_ROOT, DeviceError, ImplError

# The compile pass stops after this (or a third of --budget); timing compiles the rest, one kernel at a time
# (5-25 s each). On an H100 host with an empty kernel cache the whole table's pass needs ~250 s (2026-11-26:
# 219 kernels of the first 104 cases in 207 s, the other 44 cases' 31-53 in 40-60 s).
WARM_BUDGET_S = 360.0
WARM_BATCH_BYTES = {"cuda": 8 << 30, "cpu": 1 << 30}  # inputs held by one batch of the compile pass
INTERRUPT_EXIT_S = 20.0


def keyword_matches(case_id: str, keyword: Optional[str]) -> bool:
    """-k: no filter, or any of the comma-separated substrings occurs in the case id."""
    return keyword is None or any(k and k in case_id for k in keyword.split(","))


def _case_op_selected(case, case_ops: dict) -> bool:
    """--op by an API function's name (``args.case_ops``): only the family's cases of that op."""
    keep = case_ops.get(case.family)
    return keep is None or case.p.get("op", case.family) in keep


def last_level_cache_bytes() -> Optional[int]:
    """The largest CPU cache of this host (Linux sysfs), or None where it cannot be read."""
    import glob
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KMGkmg")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def _torch_importable() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def merge_saved(paths: List[str]):
    """(env, references, results, module) merged from files written by --json (of one graded module on one
    device: ValueError otherwise); later files win per case, except
    that a measured case is never replaced by one that was not run. Bytes moved come from the families'
    current models (a corrected model applies to older runs too), the saved count for a case no longer listed."""
    import json

    env, references, merged, order = {}, [], {}, []
    first: dict = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        origin = {"module": data.get("meta", {}).get("impl", "ops"), "device": data.get("env", {}).get("name")}
        for what, value in origin.items():
            if what in first and value != first[what][0]:
                raise ValueError(f"--from-json: {first[what][1]} has results of {what} {first[what][0]!r}, {path} of "
                                 f"{value!r}: merge runs of one module on one device")
            first.setdefault(what, (value, path))
        for k, v in data.get("env", {}).items():
            env.setdefault(k, v)
        for ref in data.get("meta", {}).get("references", []):
            if ref not in references:
                references.append(ref)
        for d in data["results"]:
            res = result_from_json(d)
            old = merged.get(res.case_id)
            if old is None:
                order.append(res.case_id)
            if old is None or not res.why.startswith("not run"):
                merged[res.case_id] = res
    model = {c.id: f.bytes_moved(c) for f in load_families() for c in f.all_cases()}
    for res in merged.values():
        res.nbytes = model.get(res.case_id, res.nbytes)
    return env, references, [merged[c] for c in order], first.get("module", ("ops",))[0]


def _replace(path: str, write) -> None:
    """``write(temporary path)``, then the temporary file renamed to ``path``: a report is whole or absent."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".get_score-", suffix=os.path.splitext(path)[1])
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_text(text: str):
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    return write


def _write_outputs(args, results, references, env, meta, title, notes=(), prog="get_score.py"):
    """The table on stdout (the run's notes were printed when it started), and the files asked for (the
    markdown with the notes)."""
    print(report.render(results, references, env, markdown=False, wide=args.wide), flush=True)
    if args.markdown:
        command = f"python {prog}" if prog.endswith(".py") else prog
        _replace(args.markdown, _write_text(
            report.render(results, references, env, markdown=True, title=title, notes=notes) +
            f"\nCommand: `{command} {' '.join(map(str, meta['argv']))}` (seed {meta['seed']}; "
                    f"tiers: {meta['tiers']}). 'ours ms' and each reference's ms: max(kernel time, pipelined wall "
                    f"time per call) of the fastest of the interleaved rounds, which the points use; 'call us': "
                    f"one call synced to the device; * a reference slower than 20 ms a call, timed by one call "
                    f"after its warm-up. GB/s counts the fewest bytes the case must move; %roof is that over the "
                    f"copy bandwidth measured in the same run.\n"))
    if args.json:
        _replace(args.json, _write_text(report.to_json(results, env, meta)))
    if args.save_tiers and not any(r.tiers for r in results):
        # an empty tiers file would grade every later run against nothing
        print(f"{prog}: no tier was measured, so --save-tiers {args.save_tiers} is not written", file=sys.stderr,
              flush=True)
    elif args.save_tiers:
        _replace(args.save_tiers, lambda tmp: report.save_tiers(tmp, results, env))
    if args.plot:
        _replace(args.plot, lambda tmp: report.plot(tmp, results, references))


# Exit statuses (README, "get_score.py"): 0 every case correct (and --fail-under met); FAILED a case wrong,
# failed or not run; USAGE a usage error or an --impl that does not import; UNDER every case correct, points under
# --fail-under; INTERRUPTED after SIGINT or SIGTERM (the report of what was measured is written).
EXIT_FAILED, EXIT_USAGE, EXIT_UNDER, EXIT_INTERRUPTED = 1, 2, 3, 130


def exit_status(results, fail_under: Optional[float]) -> int:
    if not results or not all(r.correct for r in results):
        return EXIT_FAILED
    if fail_under is not None and sum(r.points for r in results) < fail_under:
        return EXIT_UNDER
    return 0


def _stop_on_signals(cleanup) -> None:
    """The first SIGTERM or SIGINT runs ``cleanup`` and raises :class:`Interrupted`; later ones are ignored
    (a second Ctrl-C must not lose the report being written)."""
    def stop(signum, _frame):
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        cleanup()
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def _exit_killing(spare, status: int) -> None:
    """End this process now, with every process below it but ``spare`` killed first."""
    reap(spare, timeout_s=1.0)
    os._exit(status)


def _usage_error(text: str, prog: str = "get_score.py") -> int:
    print(f"{prog}: error: {text}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def shadowing_note(cwd: str) -> Optional[str]:
    """One line where ``cwd`` holds an ``ops.py`` or ``ops/`` that is not this grader's package: workers never
    import it (``worker_proxy.PACKAGE_ROOT`` comes first on their path)."""
    ours = os.path.realpath(os.path.join(PACKAGE_ROOT, "ops"))
    for name in ("ops.py", "ops"):
        path = os.path.join(cwd, name)
        if os.path.exists(path) and os.path.realpath(path) != ours:
            return (f"./{name} in the working directory is ignored: 'ops' is this grader's package (give your module "
                    f"another name and pass it with --impl)")
    return None


def _sha1(path: str) -> str:
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()


class _Progress:
    """A progress bar on a terminal (per-case lines written above it), plain per-case lines elsewhere."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc="scoring", unit="case", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def status(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text)

    def line(self, text: str) -> None:
        text = "\n".join(report.wrap(text, report.TERMINAL_WIDTH))
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def case_done(self, res: CaseResult) -> None:
        verdict = "ok" if res.correct else f"FAIL {res.why}"
        refs = " ".join(f"{k}={v.ms:.4g}" if v.ok else f"{k}=ERR" for k, v in res.refs.items())
        ours = f" ours={res.ours.ms:.4g}ms" if res.ours.ok and res.correct else ""
        secs = f" ({res.seconds:.1f} s)" if res.seconds is not None else ""
        self.line(f"{res.case_id}: {verdict}{ours} {refs}{secs}")
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def selected_cases(args, device: str):
    """(family, case) of every case the options select on ``device``; ValueError for an unknown --op."""
    families = load_families(args.op)
    case_ops = getattr(args, "case_ops", {})
    return [(f, c) for f in families for c in f.all_cases() if device in c.devices
            and keyword_matches(c.id, args.keyword) and (args.direction is None or c.direction == args.direction)
            and _case_op_selected(c, case_ops)]


def run_class(ap, args, argv_shown, stored: Optional[dict] = None) -> int:
    """Grade every module of --impl (this --shard's share), each by a grader child of its own against one set of
    tiers, one child per GPU at a time; write each one's reports, the class table, and --csv."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    out_dir = args.class_dir or "get_score_class"
    os.makedirs(out_dir, exist_ok=True)
    if args.from_json:
        try:
            rows = classroom.rows_from_json_files(args.from_json)
        except ValueError as err:
            return _usage_error(str(err))
        return _class_report(args, rows, out_dir, f"{ap.prog}: class of {len(rows)} merged from JSON, {stamp}", [])
    try:
        index, count = classroom.parse_shard(args.shard)
    except ValueError as err:
        return _usage_error(str(err))
    impls = classroom.shard(args.impls, index, count)
    if args.device is None:
        from .. import has_cuda  # only to choose the device: the children get it and import no jittor themselves
        args.device = "cuda" if has_cuda() else "cpu"
    slots = [None]
    if args.device == "cuda":
        from .._machine import count_gpus
        visible = count_gpus()
        try:
            slots = classroom.parse_gpus(args.gpus, visible)
        except ValueError as err:
            return _usage_error(str(err))
        if not slots:
            return _usage_error("--device cuda, but this host shows no GPU to grade on")
    if stored is not None:
        # the children time no reference: a case without a stored tier would give every submission 0 points
        try:
            ids = [c.id for _, c in selected_cases(args, args.device)]
        except ValueError as err:
            return _usage_error(str(err))
        missing = [i for i in ids if i not in stored]
        if missing:
            return _usage_error(f"--tiers {args.tiers} has no tiers for {len(missing)} of the {len(ids)} selected "
                                f"case(s) ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): measure "
                                f"them with the same selection and --save-tiers, or leave out --tiers")
    notes = [f"{len(impls)} submission(s){f' (shard {index}/{count})' if count > 1 else ''} on "
             f"{'GPU ' + ','.join(map(str, slots)) if args.device == 'cuda' else 'the CPU, one after another'}; "
             f"reports in {out_dir}"]
    grader = classroom.Grader(args, out_dir, slots, args.submission_timeout,
                              on_row=lambda r: print(f"{r.impl}: {r.status}, {r.points}/{r.max_points} points, "
                                                     f"{r.correct}/{r.cases} correct ({r.seconds:.0f} s)",
                                                     file=sys.stderr, flush=True))

    def stop_class():
        # As a single run's watchdog: the process ends even where exiting hangs (seen on a 2-GPU host, cause
        # not found), after the children's grace and the report.
        watchdog = threading.Timer(classroom.STOP_GRACE_S + 10 + INTERRUPT_EXIT_S, _exit_killing,
                                   (grader.own, EXIT_INTERRUPTED))
        watchdog.daemon = True
        watchdog.start()
        grader.stop_all()

    _stop_on_signals(stop_class)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # jittor's handler would end this process when a child is killed
    tiers = args.tiers
    try:
        if tiers is None:
            print(f"{ap.prog}: measuring the class's tiers: grading ops with the references", file=sys.stderr,
                  flush=True)
            measured = grader.measure_tiers()
            tiers = os.path.join(out_dir, classroom.TIERS_FILE)
            if not os.path.exists(tiers):
                return _usage_error(f"the class's tiers could not be measured (grading ops: {measured.status}, "
                                    f"{measured.why}); give --tiers")
            notes.append(f"tiers measured once by grading ops: {tiers}")
        rows = grader.grade(impls, tiers)
    except Interrupted:
        print(f"{ap.prog}: interrupted; the submissions not finished are not in the class table", file=sys.stderr)
        rows = [grader.finished[i] for i in sorted(grader.finished)]
        notes.append("interrupted: the submissions not finished are not in this table")
        _class_report(args, rows, out_dir, f"{ap.prog}: class of {len(rows)} on {args.device}, {stamp} "
                                           f"(interrupted)", notes)
        return EXIT_INTERRUPTED
    finally:
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)
        reap(grader.own)  # no child, nor anything a child left, outlives the class run
    return _class_report(args, rows, out_dir, f"{ap.prog}: class of {len(rows)} on {args.device}, {stamp}", notes)


def _class_report(args, rows, out_dir: str, title: str, notes) -> int:
    print(classroom.render_terminal(rows), flush=True)
    markdown = args.markdown or os.path.join(out_dir, classroom.CLASS_MARKDOWN)
    _replace(markdown, _write_text(classroom.render_markdown(rows, title, notes)))
    if args.csv:
        _replace(args.csv, lambda tmp: classroom.write_csv(tmp, rows))
    return 0


def main(argv: Optional[List[str]] = None, parsed=None) -> int:
    """get_score.py, or the ``ops-get-score`` command (``pip install .``). ``parsed``: (parser, args) already
    parsed by get_score.py."""
    ap, args = parsed if parsed is not None else cli_args.parse_args(argv, prog="ops-get-score")
    if args.plot:
        why_not = report.plot_available()
        if why_not:
            ap.error(why_not)
    argv_shown = sys.argv[1:] if argv is None else argv
    stored, tiers_device = None, None
    if args.tiers:
        try:
            stored, tiers_device = report.load_tiers(args.tiers)  # before any worker starts, a class's children's too
        except ValueError as err:
            return _usage_error(str(err), ap.prog)
    if args.class_mode:
        return run_class(ap, args, argv_shown, stored)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    if args.from_json:
        try:
            env, references, results, module = merge_saved(args.from_json)
        except ValueError as err:
            return _usage_error(str(err))
        grade_all(results, stored, "this run (missing in --tiers)")
        meta = {"date": stamp, "argv": argv_shown, "seed": "as saved", "impl": module, "references": references,
                "tiers": args.tiers or "as measured", "merged_from": args.from_json}
        _write_outputs(args, results, references, env, meta,
                       f"{ap.prog} results merged from {len(args.from_json)} run(s), {stamp}", prog=ap.prog)
        return exit_status(results, args.fail_under)

    from .worker import device_name
    if args.device is None:
        from .. import has_cuda  # the one reason this process imports jittor: --device spares it (the worker checks)
        device = "cuda" if has_cuda() else "cpu"
    else:
        device = args.device
    try:
        items = selected_cases(args, device)
    except ValueError as err:
        ap.error(str(err))
    if args.list:
        print("\n".join(c.id for _, c in items))
        return 0
    if not items:
        ap.error("no case matches")
    references = ["naive", "jittor"]
    notes = []
    if args.references is not None:
        references = list(args.references)
        if any(r in ("torch", "compile") for r in references) and not _torch_importable():
            notes.append("no PyTorch column: PyTorch is not installed (pip install '.[torch]')")
            references = [r for r in references if r not in ("torch", "compile")]
    elif args.no_torch:
        notes.append("PyTorch references off (--no-torch)")
    elif not _torch_importable():
        notes.append("no PyTorch column: PyTorch is not installed (pip install '.[torch]')")
    else:
        references.append("torch")
        if args.compile:
            references.append("compile")
    if stored is not None:
        warnings, _ = report.tier_warnings(args.tiers, stored, tiers_device, device_name(device),
                                           [c.id for _, c in items])
        notes += warnings
    shadowed = shadowing_note(os.getcwd())
    if shadowed:
        notes.append(shadowed)
    pending = list(notes)

    def announce():
        """The notes, once the first worker has imported the graded module (a module that does not import gets
        the one line of its error, nothing else)."""
        while pending:
            print("\n".join(report.wrap(f"{ap.prog}: {pending.pop(0)}", report.TERMINAL_WIDTH)), file=sys.stderr,
                  flush=True)

    # `timeout` (or Ctrl-C) stops the run, not the report: the cases measured so far are written out and the
    # rest are marked not run. Only the first signal interrupts; later ones are ignored while the report is
    # written (a second Ctrl-C must not lose it).
    def start_watchdog():
        # Whatever the cleanup meets (a worker stuck in a driver call, say), the process ends within
        # INTERRUPT_EXIT_S of the signal; the report is written long before in every case we know of.
        watchdog = threading.Timer(INTERRUPT_EXIT_S, os._exit, (EXIT_INTERRUPTED,))
        watchdog.daemon = True
        watchdog.start()

    _stop_on_signals(start_watchdog)
    started = time.monotonic()
    deadline = started + args.budget if args.budget is not None else None
    progress = _Progress(len(items), not args.no_progress)
    nbytes = {c.id: f.bytes_moved(c) for f, c in items}
    # Run the families' cases interleaved, so that a --budget cut-off leaves every family partly covered.
    lanes = {}
    for f, c in items:
        lanes.setdefault(c.family, []).append((f, c))
    order = [lane[i] for i in range(max(map(len, lanes.values()))) for lane in lanes.values() if i < len(lane)]
    interrupted, impl_error, device_error = None, None, None
    env, results = {}, []
    scratch = None
    warmed = None
    seed = args.seed if args.seed is not None else fresh_seed()
    # Processes the graded module leaves behind (a double fork, setsid) end up children of this process, and
    # are killed before the reports are written.
    # jittor's core exits this process when a child dies of a signal; the grader's children (workers, what they
    # leave and it kills, its probes) do
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    subreaper = become_subreaper()
    own = descendants(os.getpid())  # the grader's own processes (jittor's compilers' pool): not the workers'
    isolation = None
    try:
        class_parent = os.environ.pop(classroom.CLASS_PARENT, "")
        if class_parent and not signal_on_parent_exit(int(class_parent)):
            raise Interrupted("the class grader ended")
        scratch = tempfile.mkdtemp(prefix="get_score-", dir=scratch_root())
        isolation = Isolation(scratch, protected=[args.json, args.markdown, args.save_tiers, args.plot, args.tiers],
                              cuda=device == "cuda")
        isolation.subreaper = subreaper
        pending.append(isolation.describe())
        if not args.no_warm:
            progress.status("compiling")
            warm_budget = WARM_BUDGET_S if args.budget is None else min(WARM_BUDGET_S, args.budget / 3)
            warm_started = time.monotonic()
            warmed = warm_compile([c.id for _, c in order], device=device, impl=args.impl, budget_s=warm_budget,
                                  limit_bytes=WARM_BATCH_BYTES[device], scratch=scratch, isolation=isolation,
                                  on_ready=announce, references=references)
            warmed["wall_s"] = round(time.monotonic() - warm_started, 1)
        progress.status("scoring")
        env, results = run_cases(order, device=device, impl=args.impl, references=references, seed=seed,
                                 timeout_s=args.timeout, reference_timeout_s=args.reference_timeout,
                                 repeats=args.repeats, stored_tiers=stored, deadline=deadline,
                                 nbytes_of=nbytes.get, on_result=progress.case_done, scratch=scratch,
                                 isolation=isolation, on_ready=announce)
    except Interrupted as why:
        interrupted = why
    except ImplError as why:
        impl_error = why
    except DeviceError as why:
        device_error = why
    finally:
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        progress.close()
        reap(own)  # every process a worker started, before anything is written
        if scratch:
            import shutil
            shutil.rmtree(scratch, ignore_errors=True)
    if impl_error is not None:
        return _usage_error(f"--impl {args.impl} does not import: {impl_error}")
    if device_error is not None:
        return _usage_error(str(device_error), ap.prog)
    announce()
    if interrupted is None and any(r.why.startswith("not run: interrupted") for r in results):
        interrupted = "signal"  # run_cases stopped at the signal and returned what it had
    if interrupted is not None:
        done = {r.case_id: r for r in results}
        results = [done.get(c.id) or CaseResult(c.id, nbytes[c.id], why=f"not run: interrupted ({interrupted})")
                   for _, c in order]
    by_id = {r.case_id: r for r in results}
    results = [by_id[c.id] for _, c in items]
    grade_all(results, stored, "this run (missing in --tiers)")
    env.setdefault("device", device)
    if device == "cpu":
        env.setdefault("cache_bytes", last_level_cache_bytes())
    if "name" not in env:  # no worker said (none started): ask, unless interrupted (nvidia-smi may wait)
        env["name"] = device if interrupted is not None else device_name(device)
    title = f"{ap.prog} on {env.get('name', device)}, {stamp}"
    meta = {"date": stamp, "argv": argv_shown, "seed": seed, "seed_given": args.seed is not None,
            "impl": args.impl, "references": references, "tiers": args.tiers or "this run",
            "tiers_sha1": _sha1(args.tiers) if args.tiers else None,
            "seconds": round(time.monotonic() - started, 1), "compile_pass": warmed, "notes": notes,
            "isolation": isolation.describe() if isolation is not None else None}
    _write_outputs(args, results, references, env, meta, title, notes, prog=ap.prog)
    if interrupted is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)  # nothing left to wait for: jittor's exit hooks must not keep it alive
    return exit_status(results, args.fail_under)
