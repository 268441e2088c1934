"""What each category tried, what passed, and what it found, in a form both the
Markdown table and the JSON file are written from."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

EXAMPLES_KEPT = 3


@dataclass(frozen=True, slots=True)
class Finding:
    """One failed check: `key` groups findings of one defect (a place and an outcome)."""

    key: str
    request: str
    answer: str
    expected: str


@dataclass
class Category:
    name: str
    tried: int = 0
    passed: int = 0
    findings: list[Finding] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    headline: str = ""  # the figures in one line, for the printed details (optional)

    def record(self, finding: Finding | None) -> None:
        """One case: passed when there is no finding."""
        self.tried += 1
        if finding is None:
            self.passed += 1
        else:
            self.findings.append(finding)

    def groups(self) -> list[dict[str, Any]]:
        """Findings grouped by key, the largest group first, with a few examples each."""
        grouped: dict[str, list[Finding]] = defaultdict(list)
        for finding in self.findings:
            grouped[finding.key].append(finding)
        return [
            {
                "key": key,
                "count": len(items),
                "expected": items[0].expected,
                "examples": [
                    {"request": f.request, "answer": f.answer} for f in items[:EXAMPLES_KEPT]
                ],
            }
            for key, items in sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        ]

    def to_json(self) -> dict[str, Any]:
        answer = {
            "tried": self.tried,
            "passed": self.passed,
            "figures": self.figures,
            "found": self.groups(),
        }
        if self.headline:
            answer["headline"] = self.headline
        return answer
