"""benchmarks/demo_click.py end to end: a real `vaecast serve`, headless Chromium, one click.

No timing threshold (the number lives in the report); what is checked is that the
measurement measures: the page presented a frame of the job the click started, and
the milestones come in the order the pipeline makes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.demo_click import (
    run_demo_click,
    summarize,
    table,
    vaecast_serve,
    warm_up_ended,
)
from tests.helpers.cdp import CHROMIUM

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing"),
]

SPEC = {"scene": "shapes", "frames": 17, "width": 256, "height": 160, "fps": 16}


async def test_one_click_to_its_first_frame(tmp_path: Path) -> None:
    with vaecast_serve(tmp_path / "server.log") as url:
        assert url.startswith("http://127.0.0.1:")
        # `vaecast serve` warms the demo up in the background; /healthz says when it ends.
        warm_up = await warm_up_ended(url)
        assert warm_up["state"] == "done", warm_up
        assert set(warm_up["seconds"]) == {"scene", "audio", "decode", "encode"}
        runs = await run_demo_click(url, SPEC, repeats=1)
    [run] = runs
    assert run["job_status"] == "completed" and run["page_errors"] == []
    order = [
        run["click_to_post_sent_s"],
        run["click_to_job_created_s"],
        run["click_to_content_headers_s"],
        run["click_to_first_fragment_appended_s"],
        run["click_to_first_frame_s"],
    ]
    assert all(t is not None and t >= 0 for t in order), run
    assert order == sorted(order), run
    # The page's own figure (from its submit handler) and ours (from the click) agree.
    assert abs(run["page_time_to_first_frame_s"] - run["click_to_first_frame_s"]) < 0.05
    lines = "\n".join(table({"spec": SPEC, "summary": summarize(runs), "runs": runs}))
    assert "**the first frame presented**" in lines
