"""Schemathesis against a real `vaecast serve`, from its own /openapi.json, at CI scale:
every operation, a fixed seed and a bounded number of examples; no server error, no
answer whose status the document does not declare or whose body its schema refuses,
none slower than the bound (chaos.schema_fuzz has the run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos import schema_fuzz

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_schemathesis_finds_nothing_off_the_contract(tmp_path: Path) -> None:
    scale = schema_fuzz.SCALES["ci"]
    result = schema_fuzz.run(scale, tmp_path, schema_fuzz.DEFAULT_SEED)
    figures = result.figures()
    assert result.failures == [] and result.errors == [], result.output_tail
    assert figures["operations_tested"] == figures["operations_total"], figures
    # Each operation's coverage and fuzzing phases, and stateful scenarios besides.
    assert result.examples >= figures["operations_total"] * scale.max_examples, figures
    assert result.server_trouble == []
    # The server's own log says the same: no 5xx, none slower than the bound.
    answers = result.answers
    assert not [status for status in answers["by_status"] if status.startswith("5")], answers
    assert answers["slowest_s"] < scale.max_response_s, answers
