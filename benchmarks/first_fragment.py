"""Time to the first fragment only, many times over, on several server trees at once.

    python -m benchmarks.first_fragment --config before=/tmp/before \\
        --config after=. [--requests 30] [--frames 81 ...]

A change to what happens before the first fragment (upload parse, encoder open, the
first hand-off) moves TTFF by milliseconds, which the whole-video arms cannot resolve
on a loaded machine. Here each request to `POST /v1/videos/stream` ends as soon as the
first fragment has arrived (the client leaves and the job is cancelled), so one costs
a few tenths of a second and dozens fit in a minute. The servers take turns, request by
request, the order reversed every round, and each configuration's TTFF is divided by
the first configuration's of the same round: the median of those paired ratios and
their IQR, with the median of each stage of `arms.TTFF_STAGES`. Writes
`first_fragment.json` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.arms import TTFF_STAGES, arm_url, now_utc, take_trace, ttff_stages
from benchmarks.client import (
    ServerProcess,
    client_session,
    latents_body,
    make_latents,
    server_process,
)
from benchmarks.paired import Spread
from vaecast.codecs.fmp4_reader import TopLevelBoxSplitter

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
# After the client leaves, the cancelled job stops at its next chunk: let it end before
# the next request, so that it does not compete with it.
SETTLE_S = 0.4
WARMUP_ROUNDS = 2


async def first_fragment_s(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    """Seconds from sending `body` to the end of the first fragment after the init
    segment; the connection is closed then."""
    started = time.monotonic()
    splitter = TopLevelBoxSplitter()
    init_seen = False
    async with session.post(url, data=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.read())[:300]!r}")
        async for data in response.content.iter_any():
            for box in splitter.feed(data):
                init_seen = init_seen or box[4:8] == b"moov"
                if init_seen and box[4:8] == b"mdat":
                    ttff = time.monotonic() - started
                    response.close()
                    return ttff
    raise RuntimeError("the stream ended before its first fragment")


async def _measure(
    servers: dict[str, ServerProcess], body: bytes, fps: int, requests: int
) -> dict[str, list[dict[str, float]]]:
    rows: dict[str, list[dict[str, float]]] = {label: [] for label in servers}
    async with client_session() as session:
        for round_ in range(WARMUP_ROUNDS + requests):
            labels = list(servers) if round_ % 2 == 0 else list(reversed(servers))
            for label in labels:
                server = servers[label]
                await take_trace(session, server)
                started = time.monotonic()
                ttff = await first_fragment_s(session, arm_url(server, "vaecast", fps), body)
                await asyncio.sleep(SETTLE_S)
                trace = [{**e, "t": e["t"] - started} for e in await take_trace(session, server)]
                if round_ >= WARMUP_ROUNDS:
                    stages = ttff_stages({"ttff_s": ttff, "trace": trace})
                    rows[label].append({"ttff_s": ttff, **stages})
    return rows


def summarize(rows: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Per configuration: the paired TTFF ratio to the first, and median stages."""
    first = next(iter(rows))
    summary = {}
    for label, mine in rows.items():
        ratios = [a["ttff_s"] / b["ttff_s"] for a, b in zip(mine, rows[first], strict=True)]
        names = ["ttff_s", *(name for name, _, _ in TTFF_STAGES)]
        summary[label] = {
            "ttff_vs_first": Spread.of(ratios).as_dict(),
            "medians_s": {
                name: statistics.median(r[name] for r in mine if name in r)
                for name in names
                if any(name in r for r in mine)
            },
        }
    return summary


def markdown(result: dict[str, Any]) -> str:
    summary = result["summary"]
    names = list(dict.fromkeys(n for s in summary.values() for n in s["medians_s"]))
    lines = [
        f"Time to the first fragment, {result['meta']['requests']} requests per "
        f"configuration, taking turns ({result['meta']['finished_utc']}; load average "
        f"{result['meta']['load_start']} at start). Stages are medians in ms.",
        "",
        "| config | TTFF vs first row (median, IQR) | "
        + " | ".join("TTFF" if n == "ttff_s" else n for n in names)
        + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    for label, entry in summary.items():
        ratio = entry["ttff_vs_first"]
        cells = " | ".join(
            f"{1000 * entry['medians_s'][n]:.1f}" if n in entry["medians_s"] else "-" for n in names
        )
        lines.append(
            f"| {label} | {ratio['median']:.3f} ({ratio['q1']:.2f}-{ratio['q3']:.2f}) | {cells} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", required=True, help="LABEL=TREE")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--host-frames", default="yuv420", choices=("rgb", "yuv420"))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    configs = [text.partition("=")[::2] for text in args.config]
    meta: dict[str, Any] = {
        "started_utc": now_utc(),
        "load_start": " ".join(f"{v:.2f}" for v in os.getloadavg()),
        "requests": args.requests,
        "configs": {label: str(Path(tree).resolve()) for label, tree in configs},
    }
    work_dir = args.out / "tmp"
    body = latents_body(make_latents(args.frames, args.width, args.height, work_dir), args.fps)
    with contextlib.ExitStack() as stack:
        servers = {
            label: stack.enter_context(
                server_process(
                    args.model,
                    "cpu",
                    work_dir / f"server-ff-{label}.log",
                    args.host_frames,
                    Path(tree).resolve(),
                )
            )
            for label, tree in configs
        }
        rows = asyncio.run(_measure(servers, body, args.fps, args.requests))
    meta["finished_utc"] = now_utc()
    result = {"meta": meta, "summary": summarize(rows), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first_fragment.json").write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
