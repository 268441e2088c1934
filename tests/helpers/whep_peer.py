"""A WHEP viewer in a process of its own, for tests that kill it: `python -m
tests.helpers.whep_peer URL` connects to a WHEP URL (aiortc), prints `connected` once
its peer connection is, then receives until it is killed."""

from __future__ import annotations

import asyncio
import sys

import aiohttp

from tests.helpers.whep import WhepViewer


async def main(url: str) -> None:
    async with aiohttp.ClientSession() as client:
        viewer, response, body = await WhepViewer.connect(client, url, audio=False)
        if response.status != 201:
            print(f"refused {response.status} {body}", flush=True)
            return
        while viewer.pc.connectionState != "connected":  # noqa: ASYNC110 - aiortc's state
            await asyncio.sleep(0.02)
        print("connected", flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
