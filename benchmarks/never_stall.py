"""Never stall: the live rendition against the final alone and the preview alone.

    python -m benchmarks.never_stall [--viewers 30] [--size 256x160] [--frames 81]
                                     [--out benchmarks/results]

Why: a job with a preview decoder serves three renditions of one video. The final is
full quality but stalls a real-time viewer whenever the full VAE is slower than real
time; the preview keeps up but is never full quality; the live rendition takes each
chunk from the final when it is there by that chunk's playout deadline, from the
preview otherwise (`vaecast.server.stream.live_rendition`). This plays all three, the
same job, in three cases: the final faster than real time, 1.5x slower, 3x slower
(the embedded `tiny` decoder held to that pace by `benchmarks.paced`; the preview is
`linear`, far faster than real time in all three).

How, per case: one in-process vaecast server on 127.0.0.1 (the tests' `create_app` +
`serve_on_loopback`), one upload of a demo scene's real `tiny` latents with
`"preview": "linear"`, and from the moment it is created:
- a byte-level simulator: `--viewers` HTTP readers of each rendition's `/content`,
  each noting when every fragment has fully arrived, then played back as a real-time
  player would: it starts with the first fragment, plays each for its duration, and
  waits (a stall, moving everything after) where a fragment came late;
- a real-time player: headless Chromium, one tab per rendition, hls.js (the tests'
  page, low-latency mode, from the playlist's start) on the rendition's LL-HLS
  playlist; a `waiting` event after the first `playing` that lasts over a frame at 25
  fps counts as a stall.
Reported per case and rendition: stalls (per viewer, the median over viewers),
seconds stalled, time to the first frame (from the upload's answer to the first
fragment's arrival), the continuous play ratio (the video's length over the wall
time from its first frame to its last), and the share of the final's frames.

Writes `never_stall.json` (every viewer's numbers) and `never_stall.md` (the table).
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
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from safetensors.torch import save as save_safetensors

from benchmarks.arms import now_utc
from benchmarks.models import _commit
from benchmarks.paced import PacedDecoder
from tests.helpers.cdp import Browser, launch_chromium
from tests.helpers.hls_players import HLS_JS, HLS_JS_PAGE, PLAYOUT_WATCH, add_player_pages
from tests.helpers.server import serve_on_loopback
from vaecast.demo.sources import SceneSpec, scene_latents
from vaecast.embed import ServerConfig, create_app, runner_settings
from vaecast.models.linear import LinearDecoder
from vaecast.models.tiny import TinyDecoder

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
FPS = 16
CASES = (("final ahead", None), ("final 1.5x slower", 1.5), ("final 3x slower", 3.0))
RENDITIONS = ("live", "final", "preview")
STALL_MS = 40  # a Chromium wait over a frame at 25 fps
JOB_TIMEOUT_S = 120.0


def played(arrivals: Sequence[float], durations: Sequence[float], created: float) -> dict:
    """A real-time player of fragments that arrived at `arrivals` (this clock)."""
    start, shift, media, stalls, stalled = arrivals[0], 0.0, 0.0, 0, 0.0
    for arrived, duration in zip(arrivals, durations, strict=True):
        late = arrived - (start + shift + media)
        if late > 1e-9:
            stalls, stalled, shift = stalls + 1, stalled + late, shift + late
        media += duration
    return {
        "stalls": stalls,
        "stalled_s": stalled,
        "first_frame_s": start - created,
        "continuous": media / (media + stalled),
    }


async def read_fragments(http: aiohttp.ClientSession, url: str) -> list[float]:
    """When each fragment of `url` (a progressive fMP4) had fully arrived."""
    arrivals: list[float] = []
    buffer, offset, seen_moov = bytearray(), 0, False
    async with http.get(url) as response:
        response.raise_for_status()
        async for data in response.content.iter_any():
            buffer += data
            while offset + 8 <= len(buffer):
                size = int.from_bytes(buffer[offset : offset + 4], "big")
                if size < 8 or offset + size > len(buffer):
                    break
                kind = bytes(buffer[offset + 4 : offset + 8])
                offset += size
                if kind == b"mdat" and seen_moov:
                    arrivals.append(time.perf_counter())
                seen_moov = seen_moov or kind == b"moov"
    return arrivals


async def chromium_viewer(browser: Browser, base: str, job_id: str, rendition: str) -> dict:
    page = await browser.new_page()
    try:
        await page.send("Page.addScriptToEvaluateOnNewDocument", source=PLAYOUT_WATCH)
        query = "" if rendition == "final" else f"?rendition={rendition}"
        await page.navigate(f"{base}{HLS_JS_PAGE}/{job_id}{query}")
        facts = await page.wait_for(
            "(v => (v.ended || v.error) && {ended: v.ended, frames: "
            "v.getVideoPlaybackQuality().totalVideoFrames, duration: v.duration})"
            "(document.getElementById('video'))",
            JOB_TIMEOUT_S,
        )
        playout = await page.evaluate("window.playout")
    finally:
        await browser.close_page(page)
    waits = [w / 1000 for w in playout["waits"] if w > STALL_MS]
    wall_s = (playout["lastAt"] - playout["playingAt"]) / 1000 if playout["lastAt"] else None
    return {
        **facts,
        "stalls": len(waits),
        "stalled_s": sum(waits),
        "continuous": None if not wall_s else min(1.0, facts["duration"] / wall_s),
    }


@contextlib.asynccontextmanager
async def bench_server(pace: float | None) -> AsyncIterator[tuple[str, Any]]:
    config = ServerConfig(default_model="tiny", default_fps=FPS)  # type: ignore[arg-type]
    final = TinyDecoder() if pace is None else PacedDecoder(TinyDecoder(), pace, FPS)
    app = create_app(config, {"tiny": final, "linear": LinearDecoder()})
    add_player_pages(app, HLS_JS)
    runner = web.AppRunner(app, **runner_settings(config))
    url = await serve_on_loopback(app, runner)
    try:
        yield url, final
    finally:
        if isinstance(final, PacedDecoder):
            final.release()
        await runner.cleanup()


async def one_case(
    http: aiohttp.ClientSession, browser: Browser, pace: float | None, body: bytes, viewers: int
) -> dict[str, Any]:
    async with bench_server(pace) as (url, _):
        form = aiohttp.FormData()
        form.add_field("file", io.BytesIO(body), filename="latents.safetensors")
        form.add_field("preview", "linear")
        form.add_field("fps", str(FPS))
        async with http.post(f"{url}/v1/videos", data=form) as response:
            response.raise_for_status()
            job = await response.json()
        created = time.perf_counter()
        readers = {
            rendition: [
                asyncio.create_task(
                    read_fragments(http, f"{url}/v1/videos/{job['id']}/content?variant={rendition}")
                )
                for _ in range(viewers)
            ]
            for rendition in RENDITIONS
        }
        players = {
            rendition: asyncio.create_task(chromium_viewer(browser, url, job["id"], rendition))
            for rendition in RENDITIONS
        }
        arrivals = {r: await asyncio.gather(*tasks) for r, tasks in readers.items()}
        chromium = {r: await task for r, task in players.items()}
        async with http.get(f"{url}/v1/videos/{job['id']}") as response:
            done = await response.json()
    chunk_frames = [1] + [4] * (done["chunks"]["total"] - 1)
    durations = [frames / FPS for frames in chunk_frames]
    sources = done["variants"]["live"]["sources"]
    final_frames = sum(f for f, s in zip(chunk_frames, sources, strict=True) if s == "final")
    share = {"live": final_frames / sum(chunk_frames), "final": 1.0, "preview": 0.0}
    result: dict[str, Any] = {
        "sources": sources,
        "start_delay_s": done["variants"]["live"]["start_delay_s"],
        "bytes": {r: done["variants"][r]["bytes"] for r in RENDITIONS},
    }
    for rendition in RENDITIONS:
        runs = [played(a, durations, created) for a in arrivals[rendition]]
        result[rendition] = {
            "final_share": share[rendition],
            "stalls": statistics.median(r["stalls"] for r in runs),
            "stalled_s": statistics.median(r["stalled_s"] for r in runs),
            "first_frame_s": statistics.median(r["first_frame_s"] for r in runs),
            "continuous": statistics.median(r["continuous"] for r in runs),
            "viewers_stalling": sum(r["stalls"] > 0 for r in runs),
            "chromium": chromium[rendition],
            "viewers": runs,
        }
    return result


async def bytes_alone(http: aiohttp.ClientSession, body: bytes, model: str) -> int:
    """The size of a job of `model` without a preview: no live rendition, so no keyframe
    but its own interval's (what the renditions' switch points cost is the difference)."""
    async with bench_server(None) as (url, _):
        form = aiohttp.FormData()
        form.add_field("file", io.BytesIO(body), filename="latents.safetensors")
        for name, value in (("model", model), ("preview", "none"), ("fps", str(FPS))):
            form.add_field(name, value)
        async with http.post(f"{url}/v1/videos", data=form) as response:
            response.raise_for_status()
            job = await response.json()
        async with http.get(f"{url}/v1/videos/{job['id']}/content") as response:
            return len(await response.read())


async def measure(spec: SceneSpec, viewers: int) -> dict[str, Any]:
    if not HLS_JS.exists():
        raise FileNotFoundError(f"{HLS_JS} is missing: run tools/install-test-deps")
    body = save_safetensors({"latents": scene_latents(spec).contiguous()})
    results: dict[str, Any] = {}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=JOB_TIMEOUT_S)) as http,
        launch_chromium() as browser,
    ):
        alone = {model: await bytes_alone(http, body, model) for model in ("tiny", "linear")}
        for name, pace in CASES:
            results[name] = await one_case(http, browser, pace, body, viewers)
            results[name]["bytes_alone"] = {"final": alone["tiny"], "preview": alone["linear"]}
            live = results[name]["live"]
            print(
                f"{name}: live {live['stalls']} stalls, {live['final_share']:.0%} final; "
                f"final alone {results[name]['final']['stalls']} stalls",
                flush=True,
            )
    return results


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        "# Never stall: the live rendition, the final alone, the preview alone",
        "",
        f"`python -m benchmarks.never_stall` at {meta['commit']}, {meta['finished_utc']}: "
        f"{meta['cpus']} CPUs, load {meta['load_start']} at the start; "
        f"{result['spec']['frames']} frames of {result['spec']['size']} at {FPS} fps "
        f"(`tiny`, the final, held to each case's pace; `linear`, the preview); "
        f"{meta['viewers']} byte-level viewers a rendition, one hls.js tab a rendition.",
        "",
        "| case | rendition | stalls (sim, median) | stalled s (sim) | hls.js stalls "
        "| hls.js stalled s | first frame s | continuous play (sim / hls.js) "
        "| final frames | bytes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, data in result["cases"].items():
        for rendition in RENDITIONS:
            r = data[rendition]
            c = r["chromium"]
            hls_continuous = "-" if c["continuous"] is None else f"{c['continuous']:.2f}"
            lines.append(
                f"| {case} | {rendition} | {r['stalls']:g} ({r['viewers_stalling']} of "
                f"{len(r['viewers'])} stall) | {r['stalled_s']:.2f} | {c['stalls']} "
                f"| {c['stalled_s']:.2f} | {r['first_frame_s']:.2f} "
                f"| {r['continuous']:.2f} / {hls_continuous} | {r['final_share']:.0%} "
                f"| {data['bytes'][rendition]:,} |"
            )
    first = next(iter(result["cases"].values()))
    lines += [
        "",
        "The same latents without a preview (no live rendition, no switch points): "
        f"the final alone {first['bytes_alone']['final']:,} bytes, the preview's decoder "
        f"alone {first['bytes_alone']['preview']:,} bytes. The preview keys every chunk "
        "the live stream may switch down to; the final keys a chunk only where the live "
        "stream may switch up to it.",
        "",
        "Live start delay and each chunk's source:",
        "",
    ]
    for case, data in result["cases"].items():
        sources = "".join("F" if s == "final" else "p" for s in data["sources"])
        lines.append(f"- {case}: {data['start_delay_s']} s, `{sources}` (F final, p preview)")
    return "\n".join(lines) + "\n"


def _size(text: str) -> tuple[int, int]:
    width, height = (int(part) for part in text.lower().split("x"))
    return width, height


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.never_stall", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--viewers", type=int, default=30, help="byte-level viewers a rendition")
    parser.add_argument("--size", type=_size, default=(256, 160), help="WIDTHxHEIGHT")
    parser.add_argument("--frames", type=int, default=81, help="1 + 4k frames")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the results go")
    args = parser.parse_args(argv)
    width, height = args.size
    spec = SceneSpec("showcase", args.frames, width, height)
    started = time.monotonic()
    meta: dict[str, Any] = {
        "commit": _commit(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "viewers": args.viewers,
        "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    cases = asyncio.run(measure(spec, args.viewers))
    meta |= {"finished_utc": now_utc(), "wall_s": time.monotonic() - started}
    result = {
        "meta": meta,
        "spec": {"frames": args.frames, "size": f"{width}x{height}", "fps": FPS},
        "cases": cases,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "never_stall.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (args.out / "never_stall.md").write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main()
