"""Glass to glass: a pushed latent block's arrival to its first frame on a browser's screen.

    python -m benchmarks.glass_to_glass [--repeats 15] [--size 416x240]
                                        [--first-block 10] [--out benchmarks/results]

Why: a push session is watched while its producer is still generating, and the one
latency a viewer feels is from the producer's block to a picture. vaecast serves it
three ways; this measures each, in headless Chromium, on one machine:

- `whep`: WebRTC. The page's own WHEP player (`/?video=ID&player=webrtc`,
  vaecast/static/whep.js): the job's H.264 over RTP, into Chromium's jitter buffer.
- `mse`: the progressive MP4 of `/content`, played by the page's normal player
  (`/?video=ID`) through Media Source Extensions.
- `hls`: the LL-HLS playlist, played by hls.js (tests/helpers/hls_players.py's page,
  low-latency mode, from the playlist's start).

How: one in-process vaecast server on 127.0.0.1 (the tests' `create_app` +
`serve_on_loopback`, decoder `linear`: parameter-free, so the numbers are the server's
streaming and the player's, not a model's), the hls.js page added to its app, and one
headless Chromium (tests/helpers/cdp.py). Each run is a fresh push session (`{"input":
"push", "fps": 16}`) and a fresh tab. The tab opens the path's player first and waits
until it is ready (WHEP: the peer connection `connected`; MSE: the page has the job and
has requested `/content`; hls.js: the media attached and the playlist requested, which
the server answers once it has a segment). Then the first block is POSTed; `t0` is
Python's `time.time()` just before the POST is sent (the server's 202 is recorded too).
An init script in the tab has armed `requestVideoFrameCallback` on the `<video>`: the
first frame presented gives `performance.timeOrigin + metadata.presentationTime` (the
frame's hand-over to the compositor), a wall clock in ms on the same machine as
`time.time()`; their offset is sampled in every run (one DevTools round trip each way)
and reported. Then the rest of the latents are pushed (`final=1`), the job runs to
`completed`, and the tab is closed and the job deleted. Paths take turns, the order
rotating each repeat; one unmeasured warm-up run per path comes first.

The first block is `--first-block` latent frames (10: 37 frames at 16 fps). LL-HLS
players start only once the playlist lists a complete segment. The server's first
segment is the first chunk alone (the second chunk starts with an IDR), complete once
the second chunk exists, so any block of two or more latent frames lets every path
show its first frame without waiting for a later push; all three get the same block.

Every wait is bounded (READY_TIMEOUT_S, FIRST_FRAME_TIMEOUT_S, JOB_END_TIMEOUT_S,
the DevTools commands' own). Writes `glass_to_glass.json` (every run) and
`glass_to_glass.md` (the table) to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import torch
from aiohttp import web
from safetensors.torch import save as save_safetensors

from benchmarks.arms import now_utc
from benchmarks.models import _commit
from tests.helpers import smooth_latents
from tests.helpers.cdp import Browser, Page, launch_chromium
from tests.helpers.hls_players import HLS_JS, HLS_JS_PAGE, add_player_pages
from tests.helpers.server import serve_on_loopback
from vaecast.embed import ServerConfig, create_app, runner_settings
from vaecast.models.linear import LinearDecoder

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
PATHS = ("whep", "mse", "hls")
FPS = 16
MODEL = "linear"
SPATIAL_SCALE = 8  # linear: 8x upsampling in space
FIRST_BLOCK_LATENTS = 10  # 37 frames: past the first 2 s keyframe interval (see above)
REST_LATENTS = 2  # pushed after the first frame, with final=1: 8 frames more
WARMUP_RUNS = 1  # per path: first calls (encoder, aiortc, hls.js, MSE)
READY_TIMEOUT_S = 20.0
FIRST_FRAME_TIMEOUT_S = 20.0
JOB_END_TIMEOUT_S = 30.0
POLL_S = 0.01
PROBE = "window.glassToGlass"
HLS_JS_PACKAGE = HLS_JS.parents[1] / "package.json"

# Armed before any page script runs: the first frame the page's <video> presents, and
# every RTCPeerConnection the page makes (for the WHEP receiver's own getStats).
FRAME_PROBE = """
window.glassToGlassPeers = [];
const NativePeerConnection = window.RTCPeerConnection;
window.RTCPeerConnection = class extends NativePeerConnection {
  constructor(...args) {
    super(...args);
    window.glassToGlassPeers.push(this);
  }
};
document.addEventListener("DOMContentLoaded", () => {
  const video = document.getElementById("video");
  video.requestVideoFrameCallback((now, meta) => {
    window.glassToGlass = {
      presentationMs: performance.timeOrigin + meta.presentationTime,
      expectedDisplayMs: performance.timeOrigin + meta.expectedDisplayTime,
      callbackMs: performance.timeOrigin + now,
      mediaTime: meta.mediaTime,
      presentedFrames: meta.presentedFrames,
      width: meta.width,
      height: meta.height,
      paused: video.paused,
    };
  });
}, { once: true });
"""

# The WHEP receiver's jitter buffer and decoder, as its inbound-rtp video stats say.
RECEIVER_STATS = """(async () => {
  const out = {};
  for (const pc of window.glassToGlassPeers) {
    (await pc.getStats()).forEach((r) => {
      if (r.type === "inbound-rtp" && r.kind === "video") {
        for (const key of ["jitterBufferDelay", "jitterBufferTargetDelay",
            "jitterBufferMinimumDelay", "jitterBufferEmittedCount", "framesDecoded",
            "totalDecodeTime", "totalProcessingDelay", "framesReceived"]) {
          if (key in r) out[key] = r[key];
        }
      }
    });
  }
  return out;
})()"""

# When each path's player is ready for a first block (see the docstring).
READY = {
    "whep": "window.vaecast.webrtc().then(s => Boolean(s) && s.connection === 'connected')",
    "mse": "Boolean(window.vaecast && window.vaecast.state.ready && window.vaecast.state.jobId)",
    "hls": "Boolean(window.hls && window.hls.media)",
}
# ... and, for these paths, the player's request of this job URL is on its way (its
# answer waits for a block: /content's headers, the playlist's first segment).
REQUESTED = {"mse": "/content", "hls": "/playlist.m3u8"}


@dataclass(frozen=True, slots=True)
class Spec:
    width: int
    height: int
    first_block: int  # latent frames
    rest: int  # latent frames
    keyframe_interval_s: float | None  # None: the server's default

    @property
    def frames(self) -> int:
        return 1 + 4 * (self.first_block + self.rest - 1)


@dataclass
class Bench:
    url: str
    http: aiohttp.ClientSession
    browser: Browser
    latents: torch.Tensor


def page_url(path: str, url: str, video_id: str) -> str:
    if path == "whep":
        return f"{url}/?video={video_id}&player=webrtc"
    if path == "mse":
        return f"{url}/?video={video_id}"
    return f"{url}{HLS_JS_PAGE}/{video_id}"


async def until_ready(page: Page, path: str, video_id: str) -> None:
    await page.wait_for(READY[path], READY_TIMEOUT_S)
    if path in REQUESTED:
        wanted = f"/v1/videos/{video_id}{REQUESTED[path]}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not any(wanted in url for url in page.requests):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never requested {wanted}")
            await asyncio.sleep(POLL_S)


async def clock_offset_ms(page: Page) -> tuple[float, float]:
    """The page's wall clock minus Python's, in ms, and its uncertainty (half the round trip)."""
    before = time.time()
    page_ms = await page.evaluate("performance.timeOrigin + performance.now()")
    after = time.time()
    return page_ms - (before + after) * 500, (after - before) * 500


async def push(bench: Bench, session: dict[str, Any], block: torch.Tensor, final: bool) -> float:
    """POST one block; the time.time() just before it was sent."""
    body = save_safetensors({"latents": block.contiguous()})
    params = {"final": "1"} if final else {}
    headers = {"X-Push-Token": session["push"]["token"]}
    sent = time.time()
    async with bench.http.post(
        bench.url + session["push"]["url"], data=io.BytesIO(body), headers=headers, params=params
    ) as response:
        if response.status != 202:
            raise RuntimeError(f"push to {session['id']}: HTTP {response.status}")
    return sent


async def job_when_done(bench: Bench, video_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_END_TIMEOUT_S
    while True:
        async with bench.http.get(f"{bench.url}/v1/videos/{video_id}") as response:
            job: dict[str, Any] = await response.json()
        if job["status"] in ("completed", "failed", "cancelled"):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"{video_id} still {job['status']} after {JOB_END_TIMEOUT_S} s")
        await asyncio.sleep(POLL_S * 10)


async def one_run(bench: Bench, spec: Spec, path: str) -> dict[str, Any]:
    """One push session watched on `path` in a fresh tab: its first frame's latency."""
    async with bench.http.post(
        f"{bench.url}/v1/videos", json={"input": "push", "fps": FPS, "model": MODEL}
    ) as response:
        if response.status != 201:
            raise RuntimeError(f"POST /v1/videos: HTTP {response.status} {await response.text()}")
        session = await response.json()
    video_id = session["id"]
    page = await bench.browser.new_page(640, 480)
    requested: list[tuple[float, str]] = []  # (wall time s, URL) of each page request
    page.connection.on(
        "Network.requestWillBeSent",
        lambda event: requested.append((event["wallTime"], event["request"]["url"])),
        page.session_id,
    )
    receiver: dict[str, Any] = {}  # WHEP: its inbound-rtp stats once the first frame is out
    try:
        await page.send("Page.addScriptToEvaluateOnNewDocument", source=FRAME_PROBE)
        await page.navigate(page_url(path, bench.url, video_id), READY_TIMEOUT_S)
        await until_ready(page, path, video_id)
        offset_ms, offset_error_ms = await clock_offset_ms(page)
        t0 = await push(bench, session, bench.latents[:, :, : spec.first_block], spec.rest == 0)
        accepted = time.time()
        frame = await page.wait_for(PROBE, FIRST_FRAME_TIMEOUT_S)
        if path == "whep":
            receiver = await page.evaluate(RECEIVER_STATS)
        if spec.rest:
            await push(bench, session, bench.latents[:, :, spec.first_block :], True)
        job = await job_when_done(bench, video_id)
        errors = [line for line in page.console if line.startswith(("exception", "error"))]
        if path == "hls":
            errors += [str(e) for e in await page.evaluate("window.hlsErrors") if e.get("fatal")]
    finally:
        await bench.browser.close_page(page)
        async with bench.http.delete(f"{bench.url}/v1/videos/{video_id}"):
            pass
    if job["status"] != "completed":
        raise RuntimeError(f"{path} run {video_id} ended {job['status']}")
    playlists_after = [at for at, url in requested if at >= t0 and "/playlist.m3u8" in url]
    return {
        "path": path,
        "id": video_id,
        "latency_s": frame["presentationMs"] / 1000 - t0,
        "latency_from_accepted_s": frame["presentationMs"] / 1000 - accepted,
        "expected_display_s": frame["expectedDisplayMs"] / 1000 - t0,
        "callback_s": frame["callbackMs"] / 1000 - t0,
        "post_s": accepted - t0,
        "clock_offset_ms": offset_ms,
        "clock_offset_error_ms": offset_error_ms,
        "first_frame": {
            k: frame[k] for k in ("mediaTime", "presentedFrames", "width", "height", "paused")
        },
        # hls.js: its first playlist request after the push (a poll, or a blocking reload).
        "first_playlist_request_s": playlists_after[0] - t0 if playlists_after else None,
        "receiver_at_first_frame": receiver,
        "server_timings": job.get("timings", {}),
        "page_errors": errors,
    }


def percentile(values: Sequence[float], fraction: float) -> float:
    """The `fraction` quantile, interpolated between the closest ranks."""
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    summary: dict[str, dict[str, float | int]] = {}
    for path in PATHS:
        ofpath = [run for run in runs if run["path"] == path]
        values = [run["latency_s"] for run in ofpath]
        if values:
            summary[path] = {
                "n": len(values),
                "median_s": statistics.median(values),
                "p95_s": percentile(values, 0.95),
                "min_s": min(values),
                "max_s": max(values),
                "median_from_accepted_s": statistics.median(
                    run["latency_from_accepted_s"] for run in ofpath
                ),
            }
            polls = [r["first_playlist_request_s"] for r in ofpath if r["first_playlist_request_s"]]
            if polls:
                summary[path]["median_first_playlist_request_s"] = statistics.median(polls)
                summary[path]["median_after_that_request_s"] = statistics.median(
                    r["latency_s"] - r["first_playlist_request_s"]
                    for r in ofpath
                    if r["first_playlist_request_s"]
                )
            buffered = [
                r["receiver_at_first_frame"]["jitterBufferDelay"]
                / r["receiver_at_first_frame"]["jitterBufferEmittedCount"]
                for r in ofpath
                if r["receiver_at_first_frame"].get("jitterBufferEmittedCount")
            ]
            if buffered:
                summary[path]["median_jitter_buffer_delay_per_frame_s"] = statistics.median(
                    buffered
                )
    return summary


@contextlib.asynccontextmanager
async def bench_server(spec: Spec) -> AsyncIterator[str]:
    """The in-process vaecast server (decoder `linear`) with the hls.js page on its app."""
    config = ServerConfig(default_model=MODEL)
    if spec.keyframe_interval_s is not None:
        config = replace(
            config, encoder=replace(config.encoder, keyframe_interval_s=spec.keyframe_interval_s)
        )
    app = create_app(config, {MODEL: LinearDecoder()})
    add_player_pages(app, HLS_JS)
    runner = web.AppRunner(app, **runner_settings(config))
    url = await serve_on_loopback(app, runner)
    try:
        yield url
    finally:
        await runner.cleanup()


async def measure(spec: Spec, repeats: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Warm-up runs, then `repeats` runs of every path: (runs, facts of the browser)."""
    if not HLS_JS.exists():
        raise FileNotFoundError(f"{HLS_JS} is missing: run tools/install-test-deps")
    latents = smooth_latents(
        spec.first_block + spec.rest, spec.height // SPATIAL_SCALE, spec.width // SPATIAL_SCALE
    )
    runs: list[dict[str, Any]] = []
    async with (
        bench_server(spec) as url,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
        launch_chromium() as browser,
    ):
        bench = Bench(url, http, browser, latents)
        version = await browser.connection.send("Browser.getVersion")
        for path in PATHS * WARMUP_RUNS:
            await one_run(bench, spec, path)
        for repeat in range(repeats):
            order = PATHS[repeat % len(PATHS) :] + PATHS[: repeat % len(PATHS)]
            for path in order:
                run = {"repeat": repeat, **await one_run(bench, spec, path)}
                runs.append(run)
                _say(
                    f"repeat {repeat} {path:<4}: {run['latency_s'] * 1000:7.1f} ms "
                    f"(POST answered after {run['post_s'] * 1000:.1f} ms, clock offset "
                    f"{run['clock_offset_ms']:+.1f} ms)"
                )
    return runs, {"chromium": version.get("product"), "hls_js": _hls_js_version()}


def _hls_js_version() -> str | None:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return str(json.loads(HLS_JS_PACKAGE.read_text())["version"])
    return None


def markdown(result: dict[str, Any]) -> str:
    meta, spec = result["meta"], result["spec"]
    names = {
        "whep": "WebRTC (WHEP, the page's player)",
        "mse": "`/content` via MSE (the page's player)",
        "hls": f"LL-HLS via hls.js {meta['hls_js']}",
    }
    rows = [
        f"| {names[path]} | {s['median_s'] * 1000:.0f} | {s['p95_s'] * 1000:.0f} | "
        f"{s['min_s'] * 1000:.0f} | {s['max_s'] * 1000:.0f} | {s['n']} |"
        for path, s in result["summary"].items()
    ]
    offsets = [run["clock_offset_ms"] for run in result["runs"]]
    errors = [run["clock_offset_error_ms"] for run in result["runs"]]
    posts = [run["post_s"] * 1000 for run in result["runs"]]
    lines = [
        f"Glass to glass: a pushed latent block's POST to its first frame presented in "
        f"headless Chromium ({meta['chromium']}), per path, {meta['repeats']} repeats each "
        f"(paths in turn, a fresh push session and tab each; {meta['finished_utc']}, "
        f"{meta['wall_s']:.0f} s on {meta['cpus']} CPUs, load average {meta['load_start']} "
        f"at start; commit {meta['commit']}). Decoder `{MODEL}`, {spec['width']}x"
        f"{spec['height']} at {FPS} fps; the first block is {spec['first_block']} latent "
        f"frames ({1 + 4 * (spec['first_block'] - 1)} frames), keyframe interval "
        f"{spec['keyframe_interval_s'] or 'the server default'}.",
        "",
        "| path | median ms | p95 ms | min ms | max ms | n |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "From `time.time()` just before the block's POST to `performance.timeOrigin + "
        "presentationTime` of the first `requestVideoFrameCallback` on the page's "
        "`<video>`. The page's wall clock minus Python's, sampled in every run over one "
        f"DevTools round trip: {statistics.median(offsets):+.1f} ms (median; "
        f"{min(offsets):+.1f} to {max(offsets):+.1f} ms; half a round trip, its "
        f"uncertainty, was {statistics.median(errors):.1f} ms, median). The "
        f"POST itself was answered in {statistics.median(posts):.1f} ms (median).",
        "",
        *_notes(result),
    ]
    return "\n".join(lines)


def _notes(result: dict[str, Any]) -> list[str]:
    """What the medians are made of, where the runs recorded it."""
    summary = result["summary"]
    notes = []
    paused = {
        path: sum(run["first_frame"]["paused"] for run in result["runs"] if run["path"] == path)
        for path in summary
    }
    notes.append(
        "- Paused when its first frame was presented (runs per path): "
        + ", ".join(f"{path} {count}" for path, count in paused.items())
        + ". A paused `<video>` still shows (and reports) the frame it has."
    )
    later = {
        path: sum(
            run["first_frame"]["mediaTime"] > 0 for run in result["runs"] if run["path"] == path
        )
        for path in summary
    }
    notes.append(
        "- Runs whose first callback was for a later frame than the video's first "
        "(`mediaTime` > 0: the first was never composited, or came in the same callback): "
        + ", ".join(f"{path} {count}" for path, count in later.items())
        + ". The latency is then to that later frame."
    )
    hls = summary.get("hls", {})
    if "median_first_playlist_request_s" in hls:
        notes.append(
            "- hls.js: its first playlist request after the push came "
            f"{hls['median_first_playlist_request_s'] * 1000:.0f} ms after it (median), then "
            f"{hls['median_after_that_request_s'] * 1000:.0f} ms to the frame. Opened before "
            "the first block, hls.js asks for the playlist, and the server holds that plain "
            "request (bounded) until the playlist has a complete segment: the first chunk, "
            "complete once the second has begun. A request counted here is one after the push."
        )
    whep = summary.get("whep", {})
    if "median_jitter_buffer_delay_per_frame_s" in whep:
        notes.append(
            "- WebRTC: Chromium's jitter buffer held the first frames "
            f"{whep['median_jitter_buffer_delay_per_frame_s'] * 1000:.1f} ms each (median of "
            "`jitterBufferDelay / jitterBufferEmittedCount` read at the first frame)."
        )
    return [*notes, ""] if notes else []


def _say(text: str) -> None:
    print(f"[glass_to_glass] {text}", flush=True)


def _size(text: str) -> tuple[int, int]:
    width, height = (int(v) for v in text.lower().split("x"))
    if width % 16 or height % 16:
        raise argparse.ArgumentTypeError("width and height must be multiples of 16")
    return width, height


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.glass_to_glass", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--repeats", type=_positive, default=15, help="runs per path")
    parser.add_argument("--size", type=_size, default=(416, 240), help="WIDTHxHEIGHT")
    parser.add_argument(
        "--first-block",
        type=_positive,
        default=FIRST_BLOCK_LATENTS,
        help="latent frames in the first block",
    )
    parser.add_argument(
        "--keyframe-interval", type=float, default=None, help="seconds (server default: 2)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the results go")
    args = parser.parse_args(argv)
    spec = Spec(*args.size, args.first_block, REST_LATENTS, args.keyframe_interval)
    started = time.monotonic()
    meta: dict[str, Any] = {
        "commit": _commit(),
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    runs, facts = asyncio.run(measure(spec, args.repeats))
    meta |= facts | {"finished_utc": now_utc(), "wall_s": time.monotonic() - started}
    result = {
        "meta": meta,
        "spec": {
            "width": spec.width,
            "height": spec.height,
            "first_block": spec.first_block,
            "rest": spec.rest,
            "frames": spec.frames,
            "fps": FPS,
            "model": MODEL,
            "keyframe_interval_s": spec.keyframe_interval_s,
        },
        "summary": summarize(runs),
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "glass_to_glass.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (args.out / "glass_to_glass.md").write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main()
