"""The report: a Markdown table for the README, the details of every finding, JSON."""

from __future__ import annotations

from typing import Any

from chaos import lockout, restarts
from chaos.results import Category
from chaos.suite import Report

FOUND_IN_TABLE = 4


def _found_cell(category: Category) -> str:
    groups = category.groups()
    if not groups:
        return "none"
    cells = [f"{g['key']} (x{g['count']})" for g in groups[:FOUND_IN_TABLE]]
    if len(groups) > FOUND_IN_TABLE:
        cells.append(f"{len(groups) - FOUND_IN_TABLE} more")
    return "; ".join(cells).replace("|", "\\|")


def table(report: Report) -> str:
    lines = ["| category | tried | passed | found |", "|---|---:|---:|---|"]
    for category in report.categories:
        lines.append(
            f"| {category.name} | {category.tried} | {category.passed} | {_found_cell(category)} |"
        )
    return "\n".join(lines)


def details(report: Report) -> str:
    """Every group of findings: the request, what came back, what was expected."""
    out = []
    for category in report.categories:
        for group in category.groups():
            out.append(f"- **{category.name}: {group['key']}** (x{group['count']})")
            out.append(f"  expected: {group['expected']}")
            for example in group["examples"]:
                out.append(f"  - request: {example['request']}")
                out.append(f"    answer: {example['answer']}")
    findings = "\n".join(out) if out else "No findings."
    headlines = [f"- **{c.name}**: {c.headline}" for c in report.categories if c.headline]
    return "\n".join([findings, "", "Figures:", *headlines]) if headlines else findings


def summary(report: Report) -> dict[str, Any]:
    meta = report.meta
    lag = report.category("event-loop lag").figures
    return {
        "scale": meta["scale"],
        "seconds": meta.get("seconds"),
        "worst_lag_ms": round(1000 * float(lag["worst_s"]), 1),
        "lag_source": lag["source"],
        "encoder_faults": meta.get("encoder_faults"),
        **_store_and_admission(report),
    }


def _store_and_admission(report: Report) -> dict[str, Any]:
    """The figures of the kill/restart and fair-admission categories, where they ran."""
    ran = {c.name: c.figures for c in report.categories}
    out: dict[str, Any] = {}
    killed = ran.get(restarts.KILLED)
    if killed:
        out["kills"] = killed["kills"]
        out["restart_median_s"] = killed["start_s"]["median"]
        out["restart_max_s"] = killed["start_s"]["max"]
    for name, key in ((lockout.TRICKLING, "trickle"), (lockout.EMPTY_PUSH, "empty_push")):
        figures = ran.get(name)
        if figures:
            out[f"{key}_admission_max_ms"] = figures["admission_ms"]["max"]
    return out
