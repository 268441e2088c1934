"""The preview page's demo, click to first frame on screen, in headless Chromium.

    python -m benchmarks.demo_click [--repeats 3] [--frames 81] [--size 832x480]
                                    [--scene showcase] [--out benchmarks/results] [--cold]

A real `vaecast serve` subprocess on 127.0.0.1 and a real headless Chromium, driven
over the DevTools protocol (tests/helpers/cdp.py). Each repeat opens a fresh tab on
the page, sets the demo form and clicks Start; the page itself records when the click
was handled and when its first video frame was presented (`requestVideoFrameCallback`,
session.js: `timeToFirstFrameMs`). The milestones in between come from the page's
Resource Timing entries (the POST's answer, the content's first byte) and from the
job's own timings on the server, so a slow start says where its time went:

    click -> POST answered (job exists) -> content's first byte -> first fragment
    appended (MSE) -> first frame presented

Each job runs to its end before the next click, so runs never share the decoder. The
first click waits for the server's demo warm-up to end (`--cold`: it does not).
Writes `demo_click.json` to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.client import announced_process, vaecast_serve_url
from tests.helpers.cdp import Page, launch_chromium

FIRST_FRAME_TIMEOUT_S = 120.0
JOB_END_TIMEOUT_S = 600.0
POLL_S = 0.1
# The demo warm-up takes a few seconds of CPU (vaecast/server/intake/live_demo.py gives up at 120).
WARM_UP_WAIT_S = 150.0
MARK_NAMES = (
    "content_requested",
    "content_headers",
    "content_first_bytes",
    "init_segment_appended",
    "first_fragment_appended",
    "first_fragment_buffered",
    "play_called",
)
DEFAULT_OUT = Path(__file__).resolve().parent / "results"

# Set the form, note the moment, click: the same task, so nothing runs in between.
CLICK = """(() => {{
  const form = document.getElementById("demo-form");
  form.scene.value = {scene};
  form.frames.value = "{frames}";
  form.size.value = "{size}";
  form.fps.value = "{fps}";
  for (const field of ["scene", "frames", "size", "fps"]) {{
    if (!form[field].value) throw new Error(`the form offers no ${{field}} like that`);
  }}
  const at = performance.now();
  document.getElementById("start").click();
  return at;
}})()"""

# Installed before the page's own scripts: the moments (performance.now(), ms) when the
# content was requested, its headers and first bytes came, the first segments went
# into the SourceBuffer, and play() was called. Wrappers only note the time.
MARKS = """(() => {
  const marks = {};
  window.__demoClickMarks = marks;
  const mark = (name) => { if (!(name in marks)) marks[name] = performance.now(); };
  const fetch = window.fetch;
  window.fetch = async function (input, init) {
    const content = String((input && input.url) || input).includes("/content");
    if (content) mark("content_requested");
    const response = await fetch.call(this, input, init);
    if (content) {
      mark("content_headers");
      const reader = response.body.getReader.bind(response.body);
      response.body.getReader = function (...args) {
        const r = reader(...args);
        const read = r.read.bind(r);
        r.read = async () => {
          const result = await read();
          if (!result.done) mark("content_first_bytes");
          return result;
        };
        return r;
      };
    }
    return response;
  };
  const append = SourceBuffer.prototype.appendBuffer;
  let appends = 0;
  SourceBuffer.prototype.appendBuffer = function (data) {
    appends += 1;
    if (appends === 1) mark("init_segment_appended");
    if (appends === 2) {
      mark("first_fragment_appended");
      this.addEventListener("updateend", () => mark("first_fragment_buffered"), { once: true });
    }
    return append.call(this, data);
  };
  const play = HTMLMediaElement.prototype.play;
  HTMLMediaElement.prototype.play = function () {
    mark("play_called");
    return play.call(this);
  };
})()"""

# Milestones the page can see, in ms of its own clock (performance.now()).
MILESTONES = """(() => {
  const state = window.vaecast.state;
  const entries = performance.getEntriesByType("resource");
  const post = entries.find((e) => e.initiatorType === "fetch" && e.name.endsWith("/v1/videos"));
  return {
    jobId: state.jobId,
    status: state.status,
    clickedAt: state.clickedAt,
    firstFrameAt: state.firstFrameAt,
    timeToFirstFrameMs: state.timeToFirstFrameMs,
    fragmentsAppended: state.fragmentsAppended,
    framesShown: state.framesShown,
    postStart: post ? post.startTime : null,
    postAnswered: post ? post.responseEnd : null,
    marks: window.__demoClickMarks || {},
    errors: state.errors,
  };
})()"""


@contextmanager
def vaecast_serve(log_path: Path, extra: Sequence[str] = ()) -> Iterator[str]:
    """`vaecast serve` on a free loopback port (no API key); yields its URL."""
    env = {k: v for k, v in os.environ.items() if k != "VAECAST_API_KEY"}
    command = [sys.executable, "-m", "vaecast", "serve", "--host", "127.0.0.1", "--port", "0"]
    with announced_process(
        [*command, *extra],
        log_path,
        vaecast_serve_url,
        what="vaecast serve",
        env=env,
    ) as (url, _):
        yield url


async def _until(page: Page, expression: str, timeout_s: float) -> Any:
    return await page.wait_for(expression, timeout_s)


async def one_click(
    page: Page, http: aiohttp.ClientSession, url: str, spec: dict[str, Any]
) -> dict[str, Any]:
    await page.send("Page.addScriptToEvaluateOnNewDocument", source=MARKS)
    await page.navigate(f"{url}/")
    await _until(page, "window.vaecast && window.vaecast.state.ready", 60.0)
    load = os.getloadavg()[0]
    clicked = await page.evaluate(
        CLICK.format(
            scene=json.dumps(spec["scene"]),
            frames=spec["frames"],
            size=f"{spec['width']}x{spec['height']}",
            fps=spec["fps"],
        )
    )
    await _until(page, "window.vaecast.state.timeToFirstFrameMs !== null", FIRST_FRAME_TIMEOUT_S)
    seen = await page.evaluate(MILESTONES)
    job = await _job_when_done(http, f"{url}/v1/videos/{seen['jobId']}")

    def since_click(at: float | None) -> float | None:
        return None if at is None else (at - clicked) / 1000

    marks = seen["marks"]
    return {
        "load_1min": load,
        "click_to_first_frame_s": since_click(seen["firstFrameAt"]),
        "page_time_to_first_frame_s": seen["timeToFirstFrameMs"] / 1000,
        "click_to_post_sent_s": since_click(seen["postStart"]),
        "click_to_job_created_s": since_click(seen["postAnswered"]),
        **{f"click_to_{name}_s": since_click(marks.get(name)) for name in MARK_NAMES},
        "server": job.get("timings", {}),
        # The job's clock starts when the POST is handled, a few ms after the click.
        "job_to_first_block_in_s": job.get("timings", {}).get("queued_s"),
        "job_to_first_fragment_s": job.get("timings", {}).get("time_to_first_fragment_s"),
        "job_status": job["status"],
        "page_errors": seen["errors"],
    }


async def _job_when_done(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_END_TIMEOUT_S
    while True:
        async with http.get(url) as response:
            job = await response.json()
        if job["status"] in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
            return job
        await asyncio.sleep(POLL_S)


async def run_demo_click(url: str, spec: dict[str, Any], repeats: int) -> list[dict[str, Any]]:
    runs = []
    async with launch_chromium() as browser, aiohttp.ClientSession() as http:
        for repeat in range(repeats):
            page = await browser.new_page()
            try:
                run = await one_click(page, http, url, spec)
            finally:
                await browser.close_page(page)
            runs.append({"repeat": repeat, **run})
            _say(
                f"repeat {repeat}: click -> first frame {run['click_to_first_frame_s']:.3f} s "
                f"(job created {_s(run['click_to_job_created_s'])}, first fragment appended "
                f"{_s(run['click_to_first_fragment_appended_s'])}; server: {run['server']}), "
                f"load {run['load_1min']:.2f}"
            )
    return runs


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k in runs[0] if k.startswith(("click_to", "page_time", "job_to"))]
    summary: dict[str, Any] = {}
    for key in keys:
        values = [r[key] for r in runs if r[key] is not None]
        if values:
            summary[key] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
    summary["runs"] = len(runs)
    summary["load_1min"] = [r["load_1min"] for r in runs]
    return summary


def table(section: dict[str, Any]) -> list[str]:
    """The section of benchmarks.md: the milestones, median (min-max) of the repeats."""
    spec = section["spec"]
    lines = [
        f"## Demo: click to first frame on screen ({spec['width']}x{spec['height']}, "
        f"{spec['frames']} frames, headless Chromium, `vaecast serve`)",
        "",
        "| from the click to (server rows: from the job's creation) | median s | min s | max s |",
        "|---|---:|---:|---:|",
    ]
    names = {
        "click_to_post_sent_s": "the POST sent",
        "click_to_job_created_s": "the job created (POST answered)",
        "job_to_first_block_in_s": "(server) job created -> first latent block in",
        "job_to_first_fragment_s": "(server) job created -> first fragment in the log",
        "click_to_content_requested_s": "the content requested",
        "click_to_content_headers_s": "the content's headers",
        "click_to_content_first_bytes_s": "the content's first bytes read",
        "click_to_init_segment_appended_s": "the init segment appended (MSE)",
        "click_to_first_fragment_appended_s": "the first fragment appended",
        "click_to_first_fragment_buffered_s": "the first fragment buffered",
        "click_to_play_called_s": "play() called",
        "click_to_first_frame_s": "**the first frame presented**",
    }
    for key, name in names.items():
        stats = section["summary"].get(key)
        if stats:
            lines.append(
                f"| {name} | {stats['median']:.3f} | {stats['min']:.3f} | {stats['max']:.3f} |"
            )
    loads = ", ".join(f"{x:.2f}" for x in section["summary"]["load_1min"])
    warm_up = section.get("warm_up", {"state": "not recorded"})
    lines += [
        "",
        f"- the server's demo warm-up before the first click: {warm_up}",
        f"- load (1 min) at each click: {loads}",
        "",
    ]
    return lines


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def measure(
    spec: dict[str, Any], repeats: int, work_dir: Path, cold: bool = False
) -> dict[str, Any]:
    """The whole section: a `vaecast serve`, a Chromium, `repeats` clicks; JSON-ready.
    (`python -m benchmarks` can run it as a section and print `table(section)`.)

    The first click comes once the server's demo warm-up has ended (`/healthz`'s
    `warm_up`), as for a user who opens the page a few seconds after the server
    started; with `cold`, at once (the warm-up then stops for it, and the first click
    pays the first calls it had not made yet)."""
    with vaecast_serve(work_dir / "demo_click_server.log") as url:
        warm_up = {"state": "not waited for"} if cold else asyncio.run(warm_up_ended(url))
        _say(f"vaecast serve on {url}; warm-up {warm_up}; {repeats} clicks")
        runs = asyncio.run(run_demo_click(url, spec, repeats))
    return {"spec": spec, "warm_up": warm_up, "summary": summarize(runs), "runs": runs}


async def warm_up_ended(url: str) -> dict[str, Any]:
    """`/healthz`'s `warm_up` once it is no longer running (or after WARM_UP_WAIT_S)."""
    deadline = time.monotonic() + WARM_UP_WAIT_S
    waited_from = time.monotonic()
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(f"{url}/healthz") as response:
                warm_up: dict[str, Any] = (await response.json())["warm_up"]
            if warm_up["state"] != "running" or time.monotonic() > deadline:
                return warm_up | {"waited_s": round(time.monotonic() - waited_from, 3)}
            await asyncio.sleep(POLL_S)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo_click")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--size", default="832x480")
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--scene", default="showcase")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--cold", action="store_true", help="click at once, not after the server's warm-up"
    )
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    spec = {
        "scene": args.scene,
        "frames": args.frames,
        "width": width,
        "height": height,
        "fps": args.fps,
    }
    section = measure(spec, args.repeats, args.out / "tmp", args.cold)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "demo_click.json").write_text(json.dumps(section, indent=2))
    print("\n".join(table(section)))
    return section


if __name__ == "__main__":
    main()
