"""`python -m benchmarks.hls`: the first frame via LL-HLS against via `/content`.

For one job (81 frames at 832x480, `tiny`, a benchmark server subprocess), two
viewers start with the job: one GETs `/content` (the progressive stream), the other
plays LL-HLS as hls.js does at a live edge: a blocking playlist reload for part 0
(`_HLS_msn=0&_HLS_part=0`), then the init segment and part 0. Each records when it
holds the first playable fragment; the run is repeated, interleaved, and the medians
reported.

    python -m benchmarks.hls [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.client import (
    client_session,
    latents_body,
    make_latents,
    receive,
    server_process,
)

RESULTS = Path(__file__).resolve().parent / "results"
FPS = 16


async def one_run(url: str, body: bytes) -> dict[str, float]:
    async with client_session() as session:
        started = time.monotonic()
        async with session.post(f"{url}/v1/videos", data=body) as response:
            job = await response.json()
        content = asyncio.create_task(
            receive(session, "GET", f"{url}{job['urls']['content']}", started=started)
        )
        base = f"{url}/v1/videos/{job['id']}/"
        playlist_url = f"{url}{job['urls']['playlist']}?_HLS_msn=0&_HLS_part=0"
        async with session.get(playlist_url) as response:
            await response.text()
        async with session.get(base + "hls/init.mp4") as response:
            await response.read()
        async with session.get(base + "hls/part/0.m4s") as response:
            await response.read()
        hls_first = time.monotonic() - started
        progressive = await content
        assert progressive.first_fragment_at is not None
        return {
            "content_first_fragment_s": progressive.first_fragment_at - started,
            "hls_first_part_s": hls_first,
        }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    latents = make_latents(81, 832, 480, RESULTS / "tmp")
    body = latents_body(latents, FPS)
    runs = []
    with server_process("tiny", "cpu", RESULTS / "tmp" / "hls_server.log", "yuv420") as server:
        await one_run(server.url, body)  # warm-up, not counted
        for _ in range(args.repeats):
            runs.append(await one_run(server.url, body))
    content = statistics.median(r["content_first_fragment_s"] for r in runs)
    hls = statistics.median(r["hls_first_part_s"] for r in runs)
    return {"repeats": args.repeats, "content_s": content, "hls_s": hls, "runs": runs}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "hls.json")
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    args.out.write_text(json.dumps(result, indent=1))
    print(
        f"first playable media: /content {result['content_s'] * 1000:.0f} ms, "
        f"LL-HLS {result['hls_s'] * 1000:.0f} ms (medians of {args.repeats})"
    )


if __name__ == "__main__":
    main()
