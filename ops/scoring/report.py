"""Rendering graded results: terminal table (at most 120 columns unless asked), markdown (every column), JSON,
speedup plot, stored tiers."""
from __future__ import annotations

import dataclasses
import json
from typing import List, Optional, Sequence, Tuple

from .grading import CaseResult, gbps, speedup, summarize

TERMINAL_WIDTH = 120


def _ms(t) -> str:
    if t is None:
        return "-"
    if not t.ok:
        return "ERR"
    return _num(t.ms) + ("*" if t.slow else "")


def _num(ms: Optional[float]) -> str:
    if ms is None:
        return "-"
    return f"{ms:.4f}" if ms < 1 else f"{ms:.3f}" if ms < 100 else f"{ms:.1f}"


def _us(ms: Optional[float]) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}" if ms < 1 else f"{ms * 1e3:.0f}"


def _failure(why: str) -> str:
    """What stands in the 'ours' column of a case that earned nothing."""
    for prefix, label in (("not run", "NOT RUN"), ("hung", "HUNG"), ("crashed", "CRASHED"), ("raised", "RAISED")):
        if why.startswith(prefix):
            return label
    return "WRONG"


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _notes(res: CaseResult, references: Sequence[str]) -> List[str]:
    notes = [] if res.correct else [res.why or "wrong"]
    if res.tiers_source not in ("this run", "stored"):
        notes.append(f"tiers: {res.tiers_source}")
    if res.flops and res.ours.ok and res.correct:
        rate = res.flops / (res.ours.ms * 1e-3)
        notes.append(f"{rate / 1e12:.1f} TFLOP/s" if rate >= 1e11 else f"{rate / 1e9:.2f} GFLOP/s")
    for r in references:
        t = res.refs.get(r)
        if t is None:
            continue
        if not t.ok:
            notes.append(f"{r}: {t.error}")
        elif t.slow:
            notes.append(f"{r}: slow, timed by one call")
    return notes


def rows(results: Sequence[CaseResult], references: Sequence[str], copy_gbps: Optional[float]):
    """Every column (markdown, --wide)."""
    head = (["case", "variant", "ours ms", "kernel ms", "wall ms", "call us", "GB/s", "%roof"]
            + [f"{r} ms" for r in references] + [f"{r} call us" for r in references]
            + [f"vs {r}" for r in references] + ["pts", "note"])
    body = []
    for res in results:
        ours_gbps = gbps(res.nbytes, res.ours.ms) if res.ours.ok and res.correct else None
        roof = f"{100 * ours_gbps / copy_gbps:.0f}%" if ours_gbps and copy_gbps else "-"
        o = res.ours
        body.append([res.case_id, res.variant, _ms(o) if res.correct else _failure(res.why),
                     _num(o.kernel_ms) if res.correct else "-", _num(o.wall_ms) if res.correct else "-",
                     _us(o.call_ms) if res.correct else "-", f"{ours_gbps:.0f}" if ours_gbps else "-", roof]
                    + [_ms(res.refs.get(r)) for r in references]
                    + [_us(res.refs[r].call_ms) if r in res.refs and res.refs[r].ok else "-" for r in references]
                    + [_x(speedup(res, r)) for r in references]
                    + [str(res.points), "; ".join(_notes(res, references))])
    return head, body


def compact_rows(results: Sequence[CaseResult], references: Sequence[str], copy_gbps: Optional[float]):
    """The terminal's columns: case, ours ms, call us, %roof, speedup over each reference, points, note."""
    head = ["case", "ours ms", "call us", "%roof"] + [f"vs {r}" for r in references] + ["pts", "note"]
    body = []
    for res in results:
        ours_gbps = gbps(res.nbytes, res.ours.ms) if res.ours.ok and res.correct else None
        roof = f"{100 * ours_gbps / copy_gbps:.0f}%" if ours_gbps and copy_gbps else "-"
        body.append([res.case_id, _ms(res.ours) if res.correct else _failure(res.why),
                     _us(res.ours.call_ms) if res.correct else "-", roof]
                    + [_x(speedup(res, r)) if r in res.refs and res.refs[r].ok else
                       ("skip" if r in res.refs and (res.refs[r].error or "").startswith("skipped") else
                        "ERR" if r in res.refs else "-") for r in references]
                    + [str(res.points), "; ".join(_notes(res, references))])
    return head, body


def _shorten(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    if width <= 3:
        return text[:width]
    keep = width - 2
    return text[:keep // 2] + ".." + text[len(text) - (keep - keep // 2):]


def format_table(head, body, markdown: bool, width: Optional[int] = None) -> str:
    """Markdown, or aligned text; ``width`` caps each line (the case id and the note are shortened)."""
    if markdown:
        esc = [[c.replace("|", "/") for c in row] for row in [head] + body]
        lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc[1:]])
    table = [list(map(str, r)) for r in [head] + body]
    if width:  # the note gives way first (the per-case lines above the table have it in full), then the case
        others = sum(max(len(r[i]) for r in table) + 2 for i in range(1, len(head) - 1))
        case_w = max(16, min(max(len(r[0]) for r in table), width - others - 6))
        for r in table:
            r[0] = _shorten(r[0], case_w)
    widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
    fixed = sum(widths) + 2 * len(widths)

    def fmt(r):
        room = max(4, width - fixed) if width else None
        note = r[-1] if not room or len(r[-1]) <= room else r[-1][:room - 3] + "..."
        return ("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + note).rstrip()

    rule = "-" * min(fixed, width or fixed)
    return "\n".join([fmt(table[0]), rule] + [fmt(r) for r in table[1:]])


def format_summary(summary: dict, markdown: bool, width: Optional[int] = None) -> str:
    geo = ", ".join(f"{k} {v:.2f}x" for k, v in summary["geomean_speedup"].items() if v)
    geo_call = ", ".join(f"{k} {v:.2f}x" for k, v in summary.get("geomean_speedup_per_call", {}).items() if v)
    slow = {k: v for k, v in summary["slower_than"].items() if v}
    roof = summary["median_roofline"]
    lines = [
        f"points: {summary['points']} / {summary['max_points']}   correct: {summary['correct']} / "
        f"{summary['cases']}",
        f"geometric-mean speedup (max of kernel and pipelined wall time): {geo or '-'}",
        f"geometric-mean speedup (one synced call's wall time): {geo_call or '-'}",
        f"median % of copy roofline: {100 * roof:.0f}%" if roof else "median % of copy roofline: -",
    ]
    for ref, ids in slow.items():
        text = f"slower than {ref} on {len(ids)} case(s): {', '.join(ids)}"
        lines.append(_shorten(text, width - 2) if width and not markdown else text)
    return "\n".join(("- " + line) if markdown else line for line in lines)


def render(results: List[CaseResult], references: Sequence[str], env: dict, markdown: bool,
           title: str = "", notes: Sequence[str] = (), wide: bool = False) -> str:
    copy = env.get("copy_gbps")
    width = None if (markdown or wide) else TERMINAL_WIDTH
    head, body = (rows if markdown or wide else compact_rows)(results, references, copy)
    summary = summarize(results, copy)
    parts = []
    if markdown:
        parts.append(f"# {title}\n" if title else "")
    parts.append(f"device: {env.get('name', '?')} ({env.get('device', '?')}); copy roofline "
                 f"{copy:.0f} GB/s (read + write)" if copy else f"device: {env.get('name', '?')}")
    parts += [("- " if markdown else "") + n for n in notes]
    parts += ["", format_table(head, body, markdown, width), "", format_summary(summary, markdown, width)]
    return "\n".join(parts) + "\n"


def to_json(results: List[CaseResult], env: dict, meta: dict) -> str:
    return json.dumps({"env": env, "meta": meta, "summary": summarize(results, env.get("copy_gbps")),
                       "results": [dataclasses.asdict(r) for r in results]}, indent=1)


def save_tiers(path: str, results: List[CaseResult], env: dict) -> None:
    with open(path, "w") as f:
        json.dump({"device": env.get("name"), "tiers_gbps": {r.case_id: r.tiers for r in results if r.tiers}},
                  f, indent=1)


def load_tiers(path: str) -> Tuple[dict, Optional[str]]:
    """(tiers by case id, the device they were measured on, or None when the file does not say)."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"--tiers {path}: expected a JSON object written by --save-tiers")
    tiers = data.get("tiers_gbps", data)
    for case_id, t in tiers.items():
        if not (isinstance(t, list) and len(t) == 3 and all(isinstance(v, (int, float)) for v in t)):
            raise ValueError(f"--tiers {path}: entry {case_id!r} must be three numbers (GB/s), got {t!r}")
    return tiers, data.get("device") if "tiers_gbps" in data else None


def tier_warnings(path: str, stored: dict, device: Optional[str], this_device: str,
                  case_ids: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(warnings, case ids missing from the stored tiers). Missing cases are graded on this run's tiers."""
    warnings = []
    if device is None:
        warnings.append(f"--tiers {path} does not say which device it was measured on")
    elif device != this_device:
        warnings.append(f"--tiers {path} was measured on {device!r}, this run is on {this_device!r}: "
                        f"points compare throughputs of different machines")
    missing = [c for c in case_ids if c not in stored]
    if missing:
        warnings.append(f"--tiers {path} has no tiers for {len(missing)} of {len(case_ids)} case(s); those are "
                        f"graded on this run's tiers (flagged in the table): {', '.join(missing[:5])}"
                        + (", ..." if len(missing) > 5 else ""))
    return warnings, missing


def plot_available() -> Optional[str]:
    """None when --plot can work, else why not."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        return f"--plot needs matplotlib (pip install '.[plot]'): {err}"
    return None


def plot(path: str, results: List[CaseResult], references: Sequence[str]) -> None:
    """Horizontal bars: our speedup over each reference, log scale; needs the 'plot' extra (matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.correct]
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(shown) + 1.5))
    height = 0.8 / max(1, len(references))
    for k, ref in enumerate(references):
        vals = [speedup(r, ref) or 0 for r in shown]
        ax.barh([i + k * height for i in range(len(shown))], vals, height=height, label=f"vs {ref}")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(shown))])
    ax.set_yticklabels([r.case_id for r in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speedup (reference time / our time)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
