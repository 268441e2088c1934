"""What WHEP offers cost the rest of the server: `/healthz` latency, idle against
while 16 WebRTC peers connect at once, on the same server in the same run.

    python -m benchmarks.whep_offers [--rounds 3] [--peers 16] [--out benchmarks/results]

Why: a WHEP offer makes a peer (a certificate, the SDP, ICE gathering, then the DTLS
handshake and SRTP for every packet), in Python: in the server's process, every
request waits behind a burst of them for the GIL, even with the peers on a thread of
their own. vaecast keeps its peers in a process of its own (`webrtc.peer_host`); the
target is p99 during the offers within 3x of idle.

How: one `vaecast serve --model linear --store none` on 127.0.0.1, with one push
session (video and sound) that has its first block, so peers get media. A process of
its own (`Prober`) sends `GET /healthz` on one keep-alive connection every 10 ms and
times each answer.
Each round has an idle phase, then `BURSTS` bursts: `--peers` aiortc peers in this
process send their offers at once and connect (ICE and DTLS); the burst's window ends
once all are connected, then they close. The p99 of the answers sent inside the
bursts' windows is set against the p99 of an idle phase as long as those windows,
within the round; the report gives each round's ratio, their median and the verdict
against the target. Printed and written, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import torch

from chaos.process import REPO
from tests.helpers import safetensors_bytes, smooth_latents
from tests.helpers.serve_process import vaecast_serve
from tests.helpers.whep import WhepViewer

TARGET_RATIO = 3.0
PROBE_INTERVAL_S = 0.01
BURSTS = 4
CONNECT_TIMEOUT_S = 20.0
RATE = 16000
DEFAULT_OUT = REPO / "benchmarks" / "results"


# The prober is a process of its own: in this one it would wait for the GIL behind the
# 16 client peers, and time them instead of the server.
PROBE = """
import http.client, json, sys, threading, time
host, port, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop, answers = threading.Event(), []
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
connection = http.client.HTTPConnection(host, port, timeout=30)
while not stop.is_set():
    started = time.perf_counter()
    connection.request("GET", "/healthz")
    connection.getresponse().read()
    answers.append((started, time.perf_counter() - started))
    time.sleep(interval)
print(json.dumps(answers))
"""


class Prober:
    """`GET /healthz` every PROBE_INTERVAL_S on one connection, from a process of its
    own; `answers` (sent at, on this machine's monotonic clock; seconds) once it ends."""

    def __init__(self, host: str, port: int) -> None:
        self._command = [sys.executable, "-c", PROBE, host, str(port), str(PROBE_INTERVAL_S)]
        self.answers: list[tuple[float, float]] = []

    def __enter__(self) -> Prober:
        self._process = subprocess.Popen(
            self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        time.sleep(0.2)  # its first answers are in before the phase begins
        return self

    def __exit__(self, *exc_info: object) -> None:
        output, _ = self._process.communicate("", timeout=60)
        self.answers = [tuple(answer) for answer in json.loads(output)]


def p99_ms(latencies_s: list[float]) -> float:
    ordered = sorted(latencies_s)
    return 1000 * ordered[round(0.99 * (len(ordered) - 1))]


def inside(answers: list[tuple[float, float]], windows: list[tuple[float, float]]) -> list[float]:
    return [s for at, s in answers if any(start <= at <= end for start, end in windows)]


async def settled(pc: Any) -> None:
    """Until the peer connection is connected, or has failed."""
    done = asyncio.Event()
    pc.on("connectionstatechange", done.set)
    while pc.connectionState not in ("connected", "failed", "closed"):
        await done.wait()
        done.clear()


async def burst(client: aiohttp.ClientSession, whep: str, peers: int) -> dict[str, Any]:
    """`peers` offers at once, until all are connected: the window, and what came of it."""
    started = time.perf_counter()
    results = await asyncio.gather(
        *(WhepViewer.connect(client, whep, audio=True) for _ in range(peers))
    )
    viewers = [viewer for viewer, _, _ in results]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(settled(v.pc) for v in viewers)), CONNECT_TIMEOUT_S)
    ended = time.perf_counter()
    connected = sum(viewer.pc.connectionState == "connected" for viewer in viewers)
    for viewer in viewers:
        await viewer.close(client)
    statuses = sorted(response.status for _, response, _ in results)
    return {"window": (started, ended), "created": statuses.count(201), "connected": connected}


async def measure(rounds: int, peers: int, work_dir: Path) -> dict[str, Any]:
    arguments = ["--model", "linear", "--store", "none", "--max-webrtc-viewers", str(peers)]
    with vaecast_serve(arguments, work_dir / "serve.log") as url:
        host, port = url.rstrip("/").removeprefix("http://").split(":")
        async with aiohttp.ClientSession(url) as client:
            fields = {"input": "push", "fps": 16, "audio_sample_rate": RATE, "audio_channels": 1}
            async with client.post("/v1/videos", json=fields) as response:
                session = await response.json()
            block = safetensors_bytes(
                {"audio_sample_rate": str(RATE)},
                latents=smooth_latents(frames=2),
                audio=torch.zeros(1, 5 * RATE // 16),  # its 5 frames at 16 fps
            )
            headers = {"X-Push-Token": session["push"]["token"]}
            async with client.post(session["push"]["url"], data=block, headers=headers) as r:
                assert r.status == 202, await r.text()
            whep = f"{url.rstrip('/')}/v1/videos/{session['id']}/whep"
            results = []
            for _ in range(rounds):
                with Prober(host, int(port)) as busy:
                    bursts = [await burst(client, whep, peers) for _ in range(BURSTS)]
                windows = [b["window"] for b in bursts]
                with Prober(host, int(port)) as idle:
                    await asyncio.sleep(sum(end - start for start, end in windows))
                during = inside(busy.answers, windows)
                idle_s = [seconds for _, seconds in idle.answers]
                idle_p99, busy_p99 = p99_ms(idle_s), p99_ms(during)
                results.append(
                    {
                        "idle_p99_ms": round(idle_p99, 2),
                        "offers_p99_ms": round(busy_p99, 2),
                        "ratio": round(busy_p99 / idle_p99, 2),
                        "probes": [len(idle_s), len(during)],
                        "burst_s": [round(end - start, 2) for start, end in windows],
                        "created": [b["created"] for b in bursts],
                        "connected": [b["connected"] for b in bursts],
                    }
                )
                print(json.dumps(results[-1]))
    ratio = statistics.median(result["ratio"] for result in results)
    return {
        "peers": peers,
        "bursts": BURSTS,
        "rounds": results,
        "median_ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "verdict": "met" if ratio <= TARGET_RATIO else "missed",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", type=int, default=16)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        report = asyncio.run(measure(args.rounds, args.peers, Path(work)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "whep_offers.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"/healthz p99 during {args.peers} offers / idle: median {report['median_ratio']}x "
        f"(target <= {TARGET_RATIO}x): {report['verdict']}"
    )


if __name__ == "__main__":
    main()
