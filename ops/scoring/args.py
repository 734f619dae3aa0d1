"""get_score.py's command line, standard library only.

get_score.py loads this file by its path and parses the arguments before anything imports jittor: importing
``ops`` imports jittor, whose first import builds its core (minutes on a fresh machine), which ``--help`` or a
mistyped option must not wait for.
"""
from __future__ import annotations

import argparse
import importlib.util
import os


def _registry():
    """ops/registry.py; loaded by its path where get_score.py loads this file by its path (importing ``ops`` would
    import jittor)."""
    if __package__:
        from .. import registry
        return registry
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "registry.py")
    spec = importlib.util.spec_from_file_location("_ops_registry", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_REGISTRY = _registry()
FAMILY_NAMES = tuple(r.name for r in _REGISTRY.BUILTIN)
# --op also takes the API's other functions: their cases sit in a family. A name that is an ``op`` of the
# family's cases (``Case.p["op"]``) selects those cases; broadcast_to is what every expand_as case calls.
OP_ALIASES = {fn: (r.name, op) for r in _REGISTRY.BUILTIN for fn, op in r.aliases.items()}
REFERENCE_NAMES = ("naive", "jittor", "torch", "compile")
FAMILY_MODULES_ENV = _REGISTRY.FAMILY_MODULES_ENV
DEFAULT_TIMEOUT_S = 600.0  # per case: first-time kernel compiles and torch.compile are slow
DEFAULT_REFERENCE_TIMEOUT_S = 60.0


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (and exit status 2), not the whole usage first."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _HelpFormatter(argparse.HelpFormatter):
    """Each option's default at the end of its help, where it has one and the help does not say it already: an
    option off unless given (False) or chosen at run time (None) says so in its own words."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.default not in (None, False, argparse.SUPPRESS) and "default" not in text
                and (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))):
            text += " (default: %(default)s)"
        return text


def build_parser(prog: str = "get_score.py") -> argparse.ArgumentParser:
    ap = _Parser(
        prog=prog, formatter_class=_HelpFormatter,
        description="Score every operator case: correctness against float64 references (checked in this "
                    "process, on outputs the grading worker hands back), time per call against the naive "
                    "jittor composite, jittor's built-in and PyTorch, tier points.")
    custom = bool(os.environ.get(FAMILY_MODULES_ENV))

    def seconds_limit(flag: str, text: str) -> None:
        ap.add_argument(flag, type=float, default=None, metavar="S", help=f"{text}; default: no limit")

    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="cuda (the GPU cases) or cpu (CPU-sized cases); default: cuda where jittor has "
                         "CUDA, else cpu")
    ap.add_argument("--op", action="append", default=None, metavar="OP",
                    choices=None if custom else FAMILY_NAMES + tuple(OP_ALIASES),
                    help=f"only this op family ({', '.join(FAMILY_NAMES)}) or function of the API: transpose and "
                         f"transpose_add select those cases of the permute family, broadcast_to the expand_as "
                         f"family; repeatable (default: every family)")
    ap.add_argument("-k", dest="keyword", default=None,
                    help="only cases whose id contains this substring (several: comma-separated, any one matches)")
    ap.add_argument("--direction", choices=("fwd", "bwd"), default=None,
                    help="only forward or backward cases (default: both)")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch references (timed by default where "
                    "PyTorch is installed)")
    ap.add_argument("--references", default=None, metavar="LIST",
                    help="the references to time, comma-separated from naive,jittor,torch,compile (default: "
                         "naive,jittor and, where PyTorch is installed, torch; compile with --compile)")
    ap.add_argument("--impl", nargs="+", default=["ops"], metavar="MODULE",
                    help="module to grade, exposing ops' functions; several grade a class (one report each, a "
                         "class table, --csv), spread over --gpus")
    ap.add_argument("--tiers", metavar="F", help="grade against tiers stored in F (from --save-tiers); cases "
                    "missing there, or a file from another device, are reported and flagged")
    ap.add_argument("--save-tiers", metavar="F", help="write this run's tiers to F")
    ap.add_argument("--markdown", metavar="F", help="also write the full table as markdown to F")
    ap.add_argument("--json", metavar="F", help="also write all results as JSON to F")
    ap.add_argument("--plot", metavar="F.png", help="also draw the speedup chart (needs matplotlib: "
                    "pip install '.[plot]')")
    ap.add_argument("--seed", type=int, default=None,
                    help="seed of every input and draw of the run (the checked call's inputs, the timed calls', which "
                         "timed calls are checked), to reproduce a run; the JSON records the seed a run took. "
                         "default: fresh (a module that recorded a seeded run could replay it)")
    ap.add_argument("--fail-under", type=float, default=None, metavar="POINTS",
                    help="exit with status 3 when the points total is under POINTS (and every case is correct)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help="seconds one case may take before it is 'hung'")
    ap.add_argument("--reference-timeout", type=float, default=DEFAULT_REFERENCE_TIMEOUT_S,
                    help="seconds a reference may take to compile and run once before it is skipped")
    ap.add_argument("--repeats", type=int, default=5,
                    help="interleaved timing rounds per implementation, at most: 3 where ours is 20%% or more "
                         "from every tier boundary; up to twice as many more within 6%% of one")
    seconds_limit("--budget", "stop after S seconds: cases not finished by then are reported as not run (0 points)")
    ap.add_argument("--no-warm", action="store_true", help="skip the kernel-compile pass before timing")
    ap.add_argument("--wide", action="store_true", help="the full table on the terminal (default: at most 120 "
                    "columns; markdown and JSON always have every column)")
    ap.add_argument("--from-json", nargs="+", metavar="F", default=None,
                    help="run nothing: merge the results saved by earlier --json runs (later files win, a "
                         "measured case beats one not run) and report them, e.g. one run per --op")
    ap.add_argument("--gpus", metavar="LIST", default=None,
                    help="class grading: the GPUs to grade on, one submission at a time on each (e.g. 0,1); "
                         "default: every GPU")
    ap.add_argument("--cpus", metavar="LIST", default=None,
                    help="the CPU cores this run and its workers may use (e.g. 0-15,32-47); a class on several GPUs "
                         "gives each submission's run an equal share of this process's cores")
    ap.add_argument("--csv", metavar="F", help="class grading: one row per submission (impl, points, max_points, "
                    "correct, cases, seconds, status) to F")
    ap.add_argument("--class-dir", metavar="DIR", default=None,
                    help="class grading: each submission's markdown, JSON and log, the tiers measured and the "
                         "class table go here; default: get_score_class")
    ap.add_argument("--shard", metavar="I/N", default=None,
                    help="class grading: only submissions I, I+N, I+2N, ... (0 <= I < N; N machines share a class; "
                         "merge their JSON files with --from-json ... --csv)")
    seconds_limit("--submission-timeout",
                  "class grading: seconds one submission may take before it is stopped (status timeout)")
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def resolve_ops(names, aliases=OP_ALIASES):
    """(families, case ops): the families ``--op`` names select, in order, and for each family the ``op`` of
    the cases to keep (None: every case of the family). A family named itself keeps all its cases."""
    families, keep = [], {}
    for name in names:
        family, op = aliases.get(name, (name, None))
        if family not in keep:
            families.append(family)
            keep[family] = set()
        if keep[family] is not None:
            keep[family] = None if op is None else keep[family] | {op}
    return families, keep


def parse_args(argv=None, prog: str = "get_score.py"):
    """(parser, namespace); the parser is kept to report errors found later (e.g. an unknown family of a
    custom family module). ``args.op`` holds family names, ``args.case_ops`` the case ops each keeps."""
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    args.case_ops = {}
    if args.op:
        # a course's own families (FAMILY_MODULES_ENV) are named as they are
        args.op, args.case_ops = resolve_ops(args.op, {} if os.environ.get(FAMILY_MODULES_ENV) else OP_ALIASES)
    for name in ("timeout", "reference_timeout"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if args.references is not None:
        names = [r for r in args.references.split(",") if r]
        unknown = [r for r in names if r not in REFERENCE_NAMES]
        if unknown:
            ap.error(f"--references: unknown {', '.join(unknown)}; choose from {', '.join(REFERENCE_NAMES)}")
        args.references = names
    if args.budget is not None and args.budget < 0:
        ap.error("--budget must not be negative")
    if args.submission_timeout is not None and args.submission_timeout <= 0:
        ap.error("--submission-timeout must be positive")
    if args.cpus is not None:
        try:
            args.cpus = parse_cpus(args.cpus)
        except ValueError as err:
            ap.error(str(err))
        pin_to(args.cpus)
    args.impls = list(dict.fromkeys(args.impl))  # each module once, in the order given
    args.impl = args.impls[0]
    args.class_mode = (len(args.impls) > 1 or any(getattr(args, k) is not None for k in
                                                  ("csv", "class_dir", "shard", "gpus")))
    if args.class_mode and args.save_tiers:
        ap.error("--save-tiers grades one module; a class is graded against --tiers (or tiers measured once)")
    return ap, args


def allowed_cpus() -> list:
    """The CPU cores this process may run on, in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def parse_cpus(text: str) -> list:
    """``--cpus 0-3,8`` -> [0, 1, 2, 3, 8]; ValueError naming --cpus where it is malformed or names a core this
    process may not use."""
    cpus = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"--cpus must be core numbers and ranges separated by commas (0-15,32), got {text!r}") \
                from None
        if first > last:
            raise ValueError(f"--cpus {text!r}: the range {part.strip()} is empty")
        cpus.update(range(first, last + 1))
    outside = sorted(cpus - set(allowed_cpus()))
    if outside:
        raise ValueError(f"--cpus {text!r}: this process may not run on core(s) {', '.join(map(str, outside[:8]))}")
    return sorted(cpus)


def format_cpus(cpus) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    parts, cpus = [], sorted(cpus)
    start = prev = cpus[0]
    for c in cpus[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = c
    return ",".join(parts)


def pin_to(cpus) -> None:
    """Every thread of this process (and so every process and thread it starts later) on ``cpus``."""
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except (AttributeError, OSError):
            pass


def _siblings(cpu: int) -> str:
    """The hardware threads of ``cpu``'s physical core ('0,32', '0-1'), or the cpu alone where the system does not
    say."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            return f.read().strip()
    except OSError:
        return str(cpu)


def split_cpus(cpus, parts: int) -> list:
    """``cpus`` in ``parts`` shares of whole physical cores (hardware threads of one core stay together), of
    equal size where they divide, none empty (fewer shares where there are fewer cores)."""
    cores: dict = {}
    for cpu in sorted(cpus):
        cores.setdefault(_siblings(cpu), []).append(cpu)
    groups = list(cores.values())
    parts = max(1, min(parts, len(groups)))
    size, extra = divmod(len(groups), parts)
    shares, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        shares.append(sorted(c for g in groups[start:end] for c in g))
        start = end
    return shares
