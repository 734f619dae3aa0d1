"""Rendering graded results: terminal/markdown table, JSON, speedup plot, stored tiers."""
from __future__ import annotations

import dataclasses
import json
from typing import List, Optional, Sequence

from .grading import CaseResult, gbps, speedup, summarize


def _ms(t) -> str:
    if t is None:
        return "-"
    if not t.ok:
        return "ERR"
    return f"{t.ms:.4f}" if t.ms < 1 else f"{t.ms:.3f}" if t.ms < 100 else f"{t.ms:.1f}"


def _failure(why: str) -> str:
    """What stands in the 'ours' column of a case that earned nothing."""
    for prefix, label in (("not run", "NOT RUN"), ("hung", "HUNG"), ("crashed", "CRASHED")):
        if why.startswith(prefix):
            return label
    return "WRONG"


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def rows(results: Sequence[CaseResult], references: Sequence[str], copy_gbps: Optional[float]):
    head = (["case", "variant", "ours ms", "GB/s", "%roof"] + [f"{r} ms" for r in references]
            + [f"vs {r}" for r in references] + ["pts", "note"])
    body = []
    for res in results:
        ours_gbps = gbps(res.nbytes, res.ours.ms) if res.ours.ok else None
        roof = f"{100 * ours_gbps / copy_gbps:.0f}%" if ours_gbps and copy_gbps else "-"
        notes = [] if res.correct else [res.why or "wrong"]
        if res.flops and res.ours.ok:
            notes.append(f"{res.flops / (res.ours.ms * 1e-3) / 1e12:.1f} TFLOP/s")
        notes += [f"{r}: {res.refs[r].error}" for r in references if r in res.refs and not res.refs[r].ok]
        body.append([res.case_id, res.variant, _ms(res.ours) if res.correct else _failure(res.why),
                     f"{ours_gbps:.0f}" if ours_gbps else "-", roof]
                    + [_ms(res.refs.get(r)) for r in references]
                    + [_x(speedup(res, r)) for r in references]
                    + [str(res.points), "; ".join(notes)])
    return head, body


def format_table(head, body, markdown: bool) -> str:
    if markdown:
        esc = [[c.replace("|", "/") for c in row] for row in [head] + body]
        lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc[1:]])
    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head) - 1)]

    def fmt(r):
        return "  ".join(str(c).ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]

    return "\n".join([fmt(head), "-" * (sum(widths) + 2 * len(widths))] + [fmt(r) for r in body])


def format_summary(summary: dict, markdown: bool) -> str:
    geo = ", ".join(f"{k} {v:.2f}x" for k, v in summary["geomean_speedup"].items() if v)
    slow = {k: v for k, v in summary["slower_than"].items() if v}
    roof = summary["median_roofline"]
    lines = [
        f"points: {summary['points']} / {summary['max_points']}   correct: {summary['correct']} / "
        f"{summary['cases']}",
        f"geometric-mean speedup: {geo or '-'}",
        f"median % of copy roofline: {100 * roof:.0f}%" if roof else "median % of copy roofline: -",
    ]
    for ref, ids in slow.items():
        lines.append(f"slower than {ref} on {len(ids)} case(s): {', '.join(ids)}")
    return "\n".join(("- " + line) if markdown else line for line in lines)


def render(results: List[CaseResult], references: Sequence[str], env: dict, markdown: bool,
           title: str = "") -> str:
    copy = env.get("copy_gbps")
    head, body = rows(results, references, copy)
    summary = summarize(results, copy)
    parts = []
    if markdown:
        parts.append(f"# {title}\n" if title else "")
    parts.append(f"device: {env.get('name', '?')} ({env.get('device', '?')}); copy roofline "
                 f"{copy:.0f} GB/s (read + write)" if copy else f"device: {env.get('name', '?')}")
    parts += ["", format_table(head, body, markdown), "", format_summary(summary, markdown)]
    return "\n".join(parts) + "\n"


def to_json(results: List[CaseResult], env: dict, meta: dict) -> str:
    return json.dumps({"env": env, "meta": meta, "summary": summarize(results, env.get("copy_gbps")),
                       "results": [dataclasses.asdict(r) for r in results]}, indent=1)


def save_tiers(path: str, results: List[CaseResult], env: dict) -> None:
    with open(path, "w") as f:
        json.dump({"device": env.get("name"), "tiers_gbps": {r.case_id: r.tiers for r in results if r.tiers}},
                  f, indent=1)


def load_tiers(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    tiers = data.get("tiers_gbps", data)
    for case_id, t in tiers.items():
        if not (isinstance(t, list) and len(t) == 3 and all(isinstance(v, (int, float)) for v in t)):
            raise ValueError(f"--tiers {path}: entry {case_id!r} must be three numbers (GB/s), got {t!r}")
    return tiers


def plot(path: str, results: List[CaseResult], references: Sequence[str]) -> None:
    """Horizontal bars: our speedup over each reference, log scale; needs the 'plot' extra (matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise SystemExit(f"--plot needs matplotlib (pip install .[plot]): {err}")
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
