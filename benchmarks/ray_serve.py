"""`python -m benchmarks.ray_serve`: one job through `vaecast serve --ray local` and without it.

Two `vaecast serve` subprocesses on loopback, the same model and latents: one decodes in
its own threads (plain), the other in Ray Serve decoder replicas (`--ray local`, two
replicas of one CPU each). Measured at an HTTP client, interleaved repeats, medians:

- one job alone: time to the first playable fragment and to the last byte, from the
  POST; what Ray adds is the difference;
- what crosses a process boundary per job and per fragment: the latents going in, each
  fragment coming out (its size in the MP4, and that size as the pickled record a
  replica yields), times the number of crossings the Ray path makes;
- K jobs started at once (K = 1, 2, 4): the time until the last byte of the last job, and
  each job's own time, against one process that admits as many.

    python -m benchmarks.ray_serve [--frames 81] [--repeats 5] [--concurrency 1,2,4]

Results go to benchmarks/results/ray_serve.json and ray_serve.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.client import (
    SERVER_START_TIMEOUT_S,
    announced_process,
    client_session,
    latents_body,
    make_latents,
    receive,
    vaecast_serve_url,
)
from vaecast.cluster.records import Chunk, Segment
from vaecast.codecs.fmp4_reader import iter_boxes

RESULTS = Path(__file__).resolve().parent / "results"
FPS = 16
# Ray starts a local cluster before the server listens: on two busy cores, slow.
RAY_START_TIMEOUT_S = 2 * SERVER_START_TIMEOUT_S
ARMS = ("plain", "ray")


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    options: tuple[str, ...]


def arms(replicas: int, max_jobs: int) -> list[Arm]:
    # Both front ends admit every job of the largest K at once: what is compared is
    # where the decodes run, not the admission queue.
    admit = ("--decode-slots", str(max_jobs), "--max-queued", str(max_jobs))
    return [
        Arm("plain", admit),
        Arm(
            "ray",
            (
                *admit,
                "--ray",
                "local",
                "--replicas",
                str(replicas),
                "--replica-cpus",
                "1",
                "--replica-gpus",
                "0",
            ),
        ),
    ]


# ---------------------------------------------------------------------------
# Pure helpers (tests/test_ray_serve_benchmark.py)


def segment_sizes(mp4: bytes) -> tuple[int, list[int]]:
    """The init segment's size (everything before the first moof) and each fragment's
    (a moof and the boxes up to the next moof), from a whole fMP4 stream."""
    init = 0
    fragments: list[int] = []
    for box in iter_boxes(mp4):
        if box.type == "moof":
            fragments.append(box.size)
        elif fragments:
            fragments[-1] += box.size
        else:
            init += box.size
    return init, fragments


def pickled_overhead(size: int) -> int:
    """Bytes a `size`-byte fragment adds when it crosses as a replica's Segment record."""
    return len(pickle.dumps(Segment(b"\0" * size), protocol=5)) - size


def chunk_record_bytes() -> int:
    """A replica's per-chunk timing record, pickled (it follows each fragment)."""
    chunk = Chunk(
        index=12,
        total=21,
        frame_start=45,
        frames=4,
        bytes=21_000,
        encode_s=0.0123,
        decode_wait_s=0.0456,
    )
    return len(pickle.dumps(chunk, protocol=5))


def median_of(runs: Sequence[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def summarize_single(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per arm and Ray's added time (ray - plain) for one job alone."""
    summary: dict[str, Any] = {}
    for arm, arm_runs in runs.items():
        summary[arm] = {
            "first_fragment_s": median_of(arm_runs, "first_fragment_s"),
            "total_s": median_of(arm_runs, "total_s"),
            "job_first_fragment_s": median_of(arm_runs, "job_first_fragment_s"),
        }
    if {"plain", "ray"} <= summary.keys():
        summary["ray_added"] = {
            key: summary["ray"][key] - summary["plain"][key]
            for key in ("first_fragment_s", "total_s")
        }
    return summary


def summarize_concurrent(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (arm, K): medians over repeats of the wall time and of the median job."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["arm"], run["jobs"]), []).append(run)
    rows = []
    for (arm, jobs), group in sorted(groups.items(), key=lambda item: (item[0][1], item[0][0])):
        wall = median_of(group, "wall_s")
        rows.append(
            {
                "arm": arm,
                "jobs": jobs,
                "wall_s": wall,
                "job_s": statistics.median(statistics.median(r["job_s"]) for r in group),
                "first_fragment_s": statistics.median(
                    statistics.median(r["first_fragment_s"]) for r in group
                ),
                "jobs_per_s": jobs / wall,
            }
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    single, traffic = result["single"], result["traffic"]
    lines = [
        f"One job ({result['frames']} frames at {result['width']}x{result['height']}, "
        f"`{result['model']}` on the CPU, medians of {result['repeats']} interleaved runs):",
        "",
        "| arm | first playable fragment | of which the job's own | last byte |",
        "| --- | ---: | ---: | ---: |",
    ]
    for arm in ARMS:
        if arm in single:
            row = single[arm]
            lines.append(
                f"| {arm} | {row['first_fragment_s']:.2f} s | "
                f"{row['job_first_fragment_s']:.2f} s | {row['total_s']:.2f} s |"
            )
    if "ray_added" in single:
        added = single["ray_added"]
        lines.append(
            f"| Ray adds | {added['first_fragment_s']:+.2f} s | | {added['total_s']:+.2f} s |"
        )
    lines += [
        "",
        "\"Of which the job's own\": from the job's creation (in Ray mode, in the actor "
        "that holds it) to its first fragment, by the server's clock.",
    ]
    lines += [
        "",
        "Bytes crossing process boundaries (Ray arm):",
        "",
        "| what | bytes | crossings |",
        "| --- | ---: | ---: |",
        f"| latents in, per job | {traffic['latents_bytes']:,} | {traffic['latents_crossings']} |",
        f"| init segment, per job | {traffic['init_bytes']:,} | {traffic['fragment_crossings']} |",
        f"| fragment, median (max) | {traffic['fragment_bytes_median']:,.0f} "
        f"({traffic['fragment_bytes_max']:,}) | {traffic['fragment_crossings']} |",
        f"| pickled Segment record around a fragment | {traffic['record_overhead_bytes']} | "
        f"{traffic['fragment_crossings']} |",
        f"| per-chunk timing record (pickled) | {traffic['chunk_record_bytes']} | 1 |",
        "",
        "Crossings: latents front end -> job host -> replica; each fragment replica -> "
        "job host -> object store -> the watching front end (+1 per other front end).",
        "",
        f"K jobs at once (medians of {result['concurrency_repeats']} runs; `ray`: "
        f"{result['replicas']} replicas of 1 CPU; `plain`: one process admitting K):",
        "",
        "| K | arm | all K done | per job | first fragment | jobs/s |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in result["concurrent"]:
        lines.append(
            f"| {row['jobs']} | {row['arm']} | {row['wall_s']:.2f} s | {row['job_s']:.2f} s | "
            f"{row['first_fragment_s']:.2f} s | {row['jobs_per_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# The servers


@dataclass(frozen=True, slots=True)
class Server:
    arm: str
    url: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def vaecast_server(arm: Arm, model: str, log_path: Path) -> Iterator[Server]:
    """`vaecast serve` on a free loopback port; stopped with SIGTERM (Ray goes with it)."""
    command = [sys.executable, "-m", "vaecast", "serve", "--port", "0", "--model", model]
    with announced_process(
        [*command, *arm.options],
        log_path,
        vaecast_serve_url,
        what="vaecast serve",
        start_timeout_s=RAY_START_TIMEOUT_S if arm.name == "ray" else SERVER_START_TIMEOUT_S,
    ) as (url, process):
        yield Server(arm.name, url, process)


# ---------------------------------------------------------------------------
# The runs


async def one_job(
    session: aiohttp.ClientSession, url: str, body: bytes, started: float | None = None
) -> dict[str, Any]:
    """POST a job, stream its `/content` to the end; times from `started` (default: now)."""
    started = time.monotonic() if started is None else started
    async with session.post(f"{url}/v1/videos?fps={FPS}", data=body) as response:
        if response.status != 201:
            raise RuntimeError(f"POST /v1/videos: HTTP {response.status}: {await response.text()}")
        job = await response.json()
    received = await receive(session, "GET", f"{url}{job['urls']['content']}", started=started)
    if received.status != 200 or received.first_fragment_at is None:
        raise RuntimeError(f"GET content: HTTP {received.status}, no fragment")
    async with session.get(f"{url}/v1/videos/{job['id']}") as response:
        final = await response.json()
    if final.get("status") != "completed":
        raise RuntimeError(f"job {job['id']} ended {final.get('status')}: {final.get('error')}")
    timings = final.get("timings") or {}
    return {
        "first_fragment_s": received.first_fragment_at - started,
        "total_s": received.last_byte_at - started,
        # The job's own clock: from its creation (in Ray mode, in the actor that holds
        # it) to its first fragment; what the client waits beyond it is the way in and out.
        "job_first_fragment_s": timings.get("time_to_first_fragment_s"),
        "bytes": received.size,
        "body": received.body,
        "replica": final.get("replica"),
    }


async def concurrent_jobs(url: str, body: bytes, jobs: int) -> dict[str, Any]:
    async with client_session() as session:
        started = time.monotonic()
        done = await asyncio.gather(*(one_job(session, url, body, started) for _ in range(jobs)))
        wall = time.monotonic() - started
    return {
        "jobs": jobs,
        "wall_s": wall,
        "job_s": [d["total_s"] for d in done],
        "first_fragment_s": [d["first_fragment_s"] for d in done],
        "replicas": sorted({json.dumps(d["replica"], sort_keys=True) for d in done}),
    }


def traffic(latents_bytes: int, mp4: bytes) -> dict[str, Any]:
    """Bytes per job and per fragment that cross a process boundary on the Ray path.

    As `vaecast.cluster` moves them: the latents go from the front end that took the
    upload to the actor that holds the job (its job host), and from there to a replica
    (the decode call): 2 crossings. Each segment goes from the replica to the job host
    (the streaming call's record), which `ray.put`s it into the object store, from which
    each front end that streams the job gets it: 3 crossings with one front end
    watching, and 1 more per other front end. Each chunk's timing record follows its
    fragment from the replica to the job host.
    """
    init, fragments = segment_sizes(mp4)
    return {
        "latents_bytes": latents_bytes,
        "latents_crossings": 2,
        "init_bytes": init,
        "fragments": len(fragments),
        "fragment_bytes_median": statistics.median(fragments),
        "fragment_bytes_max": max(fragments),
        "fragment_bytes_total": sum(fragments),
        "fragment_crossings": 3,
        "record_overhead_bytes": pickled_overhead(int(statistics.median(fragments))),
        "chunk_record_bytes": chunk_record_bytes(),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tmp = RESULTS / "tmp"
    latents = make_latents(args.frames, args.width, args.height, tmp)
    body = latents_body(latents, FPS)
    single: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    concurrent: list[dict[str, Any]] = []
    mp4 = b""
    replicas_seen: set[str] = set()
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(vaecast_server(arm, args.model, tmp / f"ray_serve_{arm.name}.log"))
            for arm in arms(args.replicas, max(args.concurrency))
        ]
        async with client_session() as session:
            for server in servers:  # warm-up: model load, first replica call
                await one_job(session, server.url, body)
            for repeat in range(args.repeats):
                # Interleaved, and alternating which arm goes first.
                for server in servers if repeat % 2 == 0 else servers[::-1]:
                    run = await one_job(session, server.url, body)
                    if server.arm == "ray":
                        mp4 = run["body"]
                        replicas_seen.add(json.dumps(run["replica"], sort_keys=True))
                    run.pop("body")
                    single[server.arm].append(run)
        for repeat in range(args.concurrency_repeats):
            for jobs in args.concurrency:
                for server in servers if repeat % 2 == 0 else servers[::-1]:
                    run = await concurrent_jobs(server.url, body, jobs)
                    concurrent.append({"arm": server.arm, **run})
    return {
        "model": args.model,
        "frames": args.frames,
        "width": args.width,
        "height": args.height,
        "repeats": args.repeats,
        "replicas": args.replicas,
        "concurrency_repeats": args.concurrency_repeats,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "single": summarize_single(single),
        "single_runs": single,
        "traffic": traffic(latents.numel() * latents.element_size(), mp4),
        "replicas_seen": sorted(replicas_seen),
        "concurrent": summarize_concurrent(concurrent),
        "concurrent_runs": concurrent,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--concurrency", type=lambda text: [int(k) for k in text.split(",")], default=[1, 2, 4]
    )
    parser.add_argument("--concurrency-repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "ray_serve.json")
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    args.out.write_text(json.dumps(result, indent=1))
    table = markdown(result)
    args.out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
