"""Rendering graded results: terminal table (at most 120 columns unless asked), markdown (every column), JSON,
speedup plot, stored tiers."""
from __future__ import annotations

import dataclasses
import json
import textwrap
from typing import List, Optional, Sequence, Tuple

from .grading import CaseResult, compute_bound, gbps, roofline, speedup, summarize

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


def _flops(rate: float) -> str:
    """A FLOP rate with three significant digits (at least two): 41.0 TFLOP/s, 6.51 GFLOP/s, 950 MFLOP/s."""
    value, unit = next((rate / scale, unit) for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"),
                                                                (1, "")) if rate >= scale or unit == "")
    text = f"{value:.3g}" if value < 1 else f"{value:.{0 if value >= 100 else 1 if value >= 10 else 2}f}"
    return f"{text} {unit}FLOP/s"


def _notes(res: CaseResult, references: Sequence[str]) -> List[str]:
    notes = [] if res.correct else [res.why or "wrong"]
    if res.tiers_source not in ("this run", "stored"):
        notes.append(f"tiers: {res.tiers_source}")
    if compute_bound(res) and res.ours.ok and res.correct:
        notes.append(_flops(res.flops / (res.ours.ms * 1e-3)))
    for r in references:
        t = res.refs.get(r)
        if t is None:
            continue
        if not t.ok:
            notes.append(f"{r}: {t.error}")
        elif t.slow:
            notes.append(f"{r}: slow, timed by one call")
    return notes


def _roof(res: CaseResult, copy_gbps: Optional[float], cache_bytes: Optional[int]) -> str:
    """%roof where the copy roofline applies to the case (``grading.roofline``), else '-'."""
    fraction = roofline(res, copy_gbps, cache_bytes)
    return "-" if fraction is None else f"{100 * fraction:.0f}%"


def rows(results: Sequence[CaseResult], references: Sequence[str], copy_gbps: Optional[float],
         cache_bytes: Optional[int] = None):
    """Every column (markdown, --wide)."""
    head = (["case", "variant", "ours ms", "kernel ms", "wall ms", "call us", "GB/s", "%roof"]
            + [f"{r} ms" for r in references] + [f"{r} call us" for r in references]
            + [f"vs {r}" for r in references] + ["pts", "note"])
    body = []
    for res in results:
        ours_gbps = gbps(res.nbytes, res.ours.ms) if res.ours.ok and res.correct else None
        o = res.ours
        body.append([res.case_id, res.variant, _ms(o) if res.correct else _failure(res.why),
                     _num(o.kernel_ms) if res.correct else "-", _num(o.wall_ms) if res.correct else "-",
                     _us(o.call_ms) if res.correct else "-", f"{ours_gbps:.0f}" if ours_gbps else "-",
                     _roof(res, copy_gbps, cache_bytes)]
                    + [_ms(res.refs.get(r)) for r in references]
                    + [_us(res.refs[r].call_ms) if r in res.refs and res.refs[r].ok else "-" for r in references]
                    + [_x(speedup(res, r)) for r in references]
                    + [str(res.points), "; ".join(_notes(res, references))])
    return head, body


def compact_rows(results: Sequence[CaseResult], references: Sequence[str], copy_gbps: Optional[float],
                 cache_bytes: Optional[int] = None):
    """The terminal's columns: case, ours ms, call us, %roof (left out where it applies to no case), speedup over
    each reference, points, note."""
    head = ["case", "ours ms", "call us", "%roof"] + [f"vs {r}" for r in references] + ["pts", "note"]
    body = []
    for res in results:
        body.append([res.case_id, _ms(res.ours) if res.correct else _failure(res.why),
                     _us(res.ours.call_ms) if res.correct else "-", _roof(res, copy_gbps, cache_bytes)]
                    + [_x(speedup(res, r)) if r in res.refs and res.refs[r].ok else
                       ("skip" if r in res.refs and (res.refs[r].error or "").startswith("skipped") else
                        "ERR" if r in res.refs else "-") for r in references]
                    + [str(res.points), "; ".join(_notes(res, references))])
    if body and all(row[3] == "-" for row in body):
        head, body = head[:3] + head[4:], [row[:3] + row[4:] for row in body]
    return head, body


def wrap(text: str, width: Optional[int], indent: str = "    ") -> List[str]:
    """``text`` in lines of at most ``width`` columns, broken between words only (a case id is never cut; a
    word longer than the line stands alone on it); continuation lines start with ``indent``."""
    if not width or len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


# Room a terminal row keeps for its note, at least: a footnote mark such as "[12]".
NOTE_MIN = 5


def format_table(head, body, markdown: bool, width: Optional[int] = None) -> str:
    """Markdown, or aligned text. With ``width`` every line fits it and every case id and note is whole: an id
    too long for its column stands on a line of its own above its row, a note too long for the room left takes a
    numbered footnote below the table."""
    if markdown:
        esc = [[c.replace("|", "/") for c in row] for row in [head] + body]
        lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc[1:]])
    table = [list(map(str, r)) for r in [head] + body]
    widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
    if width:
        others = sum(w + 2 for w in widths[1:])
        note_room = NOTE_MIN + 2 if any(r[-1] for r in table[1:]) else 0
        widths[0] = max(len(head[0]), min(widths[0], width - others - note_room))
    fixed = sum(w + 2 for w in widths)
    room = width - fixed if width else None
    footnotes: dict = {}

    def fmt(r):
        note = r[-1]
        if room is not None and len(note) > room:
            note = f"[{footnotes.setdefault(note, len(footnotes) + 1)}]"
        cells = ["" if len(r[0]) > widths[0] else r[0]] + r[1:-1]
        line = ("  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + note).rstrip()
        return [r[0], line] if len(r[0]) > widths[0] else [line]

    lines = fmt(table[0])
    rule_at = len(lines)
    for r in table[1:]:
        lines += fmt(r)
    lines.insert(rule_at, "-" * min(max(map(len, lines)), width or fixed))
    if footnotes:
        lines.append("")
        for note, n in footnotes.items():
            lines += wrap(f"[{n}] {note}", width, " " * len(f"[{n}] "))
    return "\n".join(lines)


def _id_lines(prefix: str, ids: Sequence[str], width: int, max_lines: int = 6) -> List[str]:
    """``prefix`` and the comma-separated ``ids`` in lines of at most ``width`` columns, ids whole; past
    ``max_lines`` lines the rest are counted ("and 12 more", room for which the last line keeps)."""
    lines, line, indent = [], prefix, "   "
    for i, case_id in enumerate(ids):
        item = f" {case_id}" + ("," if i < len(ids) - 1 else "")
        left = len(ids) - i - 1
        reserve = len(f" and {left} more") if left and len(lines) + 1 == max_lines else 0
        if len(line) + len(item) + reserve > width and line not in (prefix, indent):
            if len(lines) + 1 == max_lines:
                return lines + [f"{line} and {left + 1} more"]
            lines.append(line)
            line = indent
        line += item
    return lines + [line]


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
        f"median % of copy roofline: {100 * roof:.0f}%" + (f" (of the {summary['roofline_cases']} cases it applies "
                                                              f"to)" if summary.get("roofline_cases") else "")
        if roof else "median % of copy roofline: - (it applies to no case here)",
    ]
    for ref, ids in slow.items():
        prefix = f"slower than {ref} on {len(ids)} case(s):"
        if width and not markdown:
            lines += _id_lines(prefix, ids, width)
        else:
            lines.append(f"{prefix} {', '.join(ids)}")
    return "\n".join(("- " + line) if markdown else line for line in lines)


def render(results: List[CaseResult], references: Sequence[str], env: dict, markdown: bool,
           title: str = "", notes: Sequence[str] = (), wide: bool = False) -> str:
    copy, cache = env.get("copy_gbps"), env.get("cache_bytes")
    width = None if (markdown or wide) else TERMINAL_WIDTH
    head, body = (rows if markdown or wide else compact_rows)(results, references, copy, cache)
    summary = summarize(results, copy, cache)
    parts = []
    if markdown:
        parts.append(f"# {title}\n" if title else "")
    where = f"; %roof for cases beyond the {cache / 2 ** 20:.0f} MiB last-level cache" if cache else ""
    parts.append(f"device: {env.get('name', '?')} ({env.get('device', '?')}); copy roofline "
                 f"{copy:.0f} GB/s (read + write{where})" if copy else f"device: {env.get('name', '?')}")
    parts += [line for n in notes for line in wrap(("- " if markdown else "") + n, width)]
    parts += ["", format_table(head, body, markdown, width), "", format_summary(summary, markdown, width)]
    return "\n".join(parts) + "\n"


def to_json(results: List[CaseResult], env: dict, meta: dict) -> str:
    return json.dumps({"env": env, "meta": meta,
                       "summary": summarize(results, env.get("copy_gbps"), env.get("cache_bytes")),
                       "results": [dataclasses.asdict(r) for r in results]}, indent=1)


def save_tiers(path: str, results: List[CaseResult], env: dict) -> None:
    with open(path, "w") as f:
        json.dump({"device": env.get("name"), "tiers_gbps": {r.case_id: r.tiers for r in results if r.tiers}},
                  f, indent=1)


def load_tiers(path: str) -> Tuple[dict, Optional[str]]:
    """(tiers by case id, the device they were measured on, or None when the file does not say)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"--tiers {path}: not a file written by --save-tiers ({err})") from None
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
