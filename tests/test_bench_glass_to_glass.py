"""benchmarks/glass_to_glass.py end to end at its smallest: an in-process server, headless
Chromium, two repeats of each path.

No timing target (the numbers live in benchmarks/results/glass_to_glass.md); what is
checked is that the measurement measures: every path presented a frame of its own job
(the job's size, one of the video's first frames), after its block was
pushed, and the report says so in its table and its JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.glass_to_glass import PATHS, main, percentile
from tests.helpers.cdp import CHROMIUM
from tests.helpers.hls_players import HLS_JS

WIDTH, HEIGHT = 256, 160
REPEATS = 2
FIRST_FRAMES_S = 0.2  # 3 frames at 16 fps: WebRTC's mediaTime starts at 0 as well
MAX_LATENCY_S = 10.0  # sanity only: a first frame later than this is a hang, not a number


@pytest.mark.parametrize(
    ("values", "fraction", "expected"),
    [
        ([3.0], 0.95, 3.0),
        ([1.0, 2.0], 0.5, 1.5),
        ([4.0, 1.0, 3.0, 2.0, 5.0], 0.95, 4.8),
        ([4.0, 1.0, 3.0, 2.0, 5.0], 0.0, 1.0),
        ([4.0, 1.0, 3.0, 2.0, 5.0], 1.0, 5.0),
    ],
)
def test_percentile_interpolates_between_ranks(
    values: list[float], fraction: float, expected: float
) -> None:
    assert percentile(values, fraction) == pytest.approx(expected)


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(120)
def test_every_path_presents_a_first_frame(tmp_path: Path) -> None:
    for needed, hint in ((CHROMIUM, "Debian's chromium"), (HLS_JS, "hls.js")):
        if not needed.exists():
            pytest.fail(f"{needed} is missing: run tools/install-test-deps (it installs {hint})")
    result = main(
        ["--repeats", str(REPEATS), "--size", f"{WIDTH}x{HEIGHT}", "--out", str(tmp_path)]
    )

    assert json.loads((tmp_path / "glass_to_glass.json").read_text()) == result
    assert set(result["summary"]) == set(PATHS)
    for path, stats in result["summary"].items():
        assert stats["n"] == REPEATS, path
        assert 0 < stats["min_s"] <= stats["median_s"] <= stats["p95_s"] <= stats["max_s"], stats
        assert stats["max_s"] < MAX_LATENCY_S, (path, stats)
    assert len(result["runs"]) == REPEATS * len(PATHS)
    for run in result["runs"]:
        assert 0 < run["post_s"] < run["latency_s"] < MAX_LATENCY_S, run
        assert (run["first_frame"]["width"], run["first_frame"]["height"]) == (WIDTH, HEIGHT), run
        assert run["page_errors"] == [], run
        assert abs(run["clock_offset_ms"]) < 50, run  # one machine: one wall clock
        # The video's first frame, or (coalesced by the compositor) one of the next.
        assert 0 <= run["first_frame"]["mediaTime"] < FIRST_FRAMES_S, run
        if run["path"] == "hls":
            assert 0 < run["first_playlist_request_s"] < run["latency_s"], run
        if run["path"] == "whep":
            # getStats may not have its inbound-rtp entry yet at the first frame's callback
            # (the frame presented proves the decode); when it has, it counts that frame.
            assert run["receiver_at_first_frame"].get("framesDecoded", 1) >= 1, run

    table = (tmp_path / "glass_to_glass.md").read_text()
    for name in ("WebRTC (WHEP", "`/content` via MSE", "LL-HLS via hls.js"):
        [row] = [line for line in table.splitlines() if line.startswith(f"| {name}")]
        assert row.endswith(f"| {REPEATS} |"), row
