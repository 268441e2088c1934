"""benchmarks/never_stall.py end to end at its smallest: the three cases on a short video,
two byte-level viewers and one hls.js tab a rendition.

No target (the numbers live in benchmarks/results/never_stall.md); what is checked is
that the measurement measures: every viewer of every rendition played the whole video,
the final alone carries all final frames and the preview none, the live rendition's
sources are one per chunk, and the report says so in its table and its JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.never_stall import CASES, RENDITIONS, main, played
from tests.helpers.cdp import CHROMIUM
from tests.helpers.hls_players import HLS_JS

FRAMES = 17  # 5 chunks: 1, then 4 a chunk


def test_the_simulated_player_waits_where_a_fragment_is_late() -> None:
    # Three fragments of 0.25 s: the second on time, the third 0.5 s late.
    result = played([10.0, 10.2, 11.0], [0.25, 0.25, 0.25], created=9.5)
    assert (result["stalls"], result["stalled_s"]) == (1, pytest.approx(0.5))
    assert result["first_frame_s"] == pytest.approx(0.5)
    assert result["continuous"] == pytest.approx(0.75 / 1.25)


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(180)
def test_three_cases_three_renditions_each_played_whole(tmp_path: Path) -> None:
    for needed, hint in ((CHROMIUM, "Debian's chromium"), (HLS_JS, "hls.js")):
        if not needed.exists():
            pytest.fail(f"{needed} is missing: run tools/install-test-deps (it installs {hint})")
    result = main(["--viewers", "2", "--frames", str(FRAMES), "--out", str(tmp_path)])

    assert json.loads((tmp_path / "never_stall.json").read_text()) == result
    assert list(result["cases"]) == [name for name, _ in CASES]
    table = (tmp_path / "never_stall.md").read_text()
    for name, case in result["cases"].items():
        assert len(case["sources"]) == 5 and set(case["sources"]) <= {"final", "preview"}
        assert (case["final"]["final_share"], case["preview"]["final_share"]) == (1.0, 0.0)
        for rendition in RENDITIONS:
            data = case[rendition]
            assert len(data["viewers"]) == 2
            assert all(0 < v["continuous"] <= 1 for v in data["viewers"]), data
            assert data["chromium"]["ended"] and data["chromium"]["frames"] == FRAMES, data
            assert f"| {name} | {rendition} |" in table
