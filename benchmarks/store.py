"""What the durable store costs a viewer: `--store DIR` against `--store none`, paired.

    python -m benchmarks.store [--repeats 15] [--size 81x832x480 --size 33x416x240]
                               [--out benchmarks/results]

Why: with the store on (the default of `vaecast serve`) every committed fragment is
also written to `videos/<id>.mp4` and indexed by a SQLite row (a rollback journal,
synchronous=FULL), and a completed job's file is fsynced before its `completed` row.
None of that should delay the viewer much; this measures how much it does.

How: two `vaecast serve --model tiny --device cpu` processes on 127.0.0.1, the same
settings but `--store <tempdir>/store` for one and `--store none` for the other
(always explicit, so the user's data directory is never touched), both up for the
whole run and past their demo warm-up. Each repeat streams the same latents once
through each (`POST /v1/videos/stream`, timed box by box by `client.receive`), the two
runs back to back, the order alternating from repeat to repeat (and from size to size),
so each pair meets the same machine load. The ratios store / no store of the time to
the first byte and to the last byte are computed within each pair; the report gives
their median and spread over the repeats and judges them as `paired.verdict` does
(median and IQR against the target; fewer than `paired.MIN_REPEATS` repeats decide
nothing). The verdicts are printed, never asserted.

After the last byte the client asks for the job's id (`GET /v1/videos?limit=1`, on the
same keep-alive connection: aiohttp serves it only once the stream's handler has
returned, which with a store is after the store's `settle` flush), polls
`GET /v1/videos/{id}` until it says `completed` (both arms), and on the store arm reads
the job's `finished_at` from the store's database (read-only, a query of a
millisecond: the server's writer waits at most that long for it): the store stamps it
after fsyncing the file and its folder, so `finished_at - last byte` is how long the
video took to become durable after the viewer had it all (the fsyncs plus the store
thread's queue ahead of them).
The client and the server share the machine's wall clock; the file system the store
is on is recorded (on tmpfs an fsync is free: set TMPDIR to a disk). Every finished
video is deleted before the next run, so neither memory nor the store grows over the
run. Every wait is bounded: the servers' start and stop (`client`), their warm-up
(`demo_click`), each run (`RUN_TIMEOUT_S`), each status poll (`STATUS_TIMEOUT_S`).

After each run, once its CPU time is taken, the finished job's thumbnail and
spritesheet are asked for (`stills_of`): each is made then, on first request, from
the job's MP4 (on the store arm, the file the store kept), so their times are what
the stills cost a finished job, set against the job's own last byte.

Writes `store.json` (every run) and `store.md` (the tables) to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks import load
from benchmarks.arms import now_utc
from benchmarks.client import (
    announced_process,
    client_session,
    cpu_seconds,
    latents_body,
    make_latents,
    receive,
    vaecast_serve_url,
)
from benchmarks.demo_click import warm_up_ended
from benchmarks.paired import Spread, Target, explain, verdict
from vaecast.store.database import DATABASE_NAME

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
DEFAULT_SIZES = ("81x832x480", "33x416x240")
FPS = 16
ARMS = ("none", "store")  # the baseline first: ratios are store / none
TARGETS: dict[str, Target] = {
    "first_byte": Target(1.5, "first byte, store / no store"),
    "last_byte": Target(1.3, "last byte, store / no store"),
}
MEASURES = {"first_byte": "ttfb_s", "last_byte": "last_byte_s"}  # the judged ones
RATIOS = {**MEASURES, "first_fragment": "ttff_s"}  # and one more, for information
WARMUP_RUNS = 1  # per arm and size: first calls, page cache
STATUS_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 300.0  # one stream and what follows it (a run takes seconds)
POLL_S = 0.005


def parse_size(text: str) -> tuple[int, int, int]:
    frames, width, height = (int(v) for v in text.lower().split("x"))
    return frames, width, height


async def completed_at(
    session: aiohttp.ClientSession, url: str, job_id: str, timeout_s: float = STATUS_TIMEOUT_S
) -> float:
    """The monotonic moment `GET /v1/videos/{id}` first says `completed`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with session.get(f"{url}/v1/videos/{job_id}") as response:
            status = (await response.json())["status"]
        if status == "completed":
            return time.monotonic()
        if status in ("failed", "cancelled"):
            raise RuntimeError(f"job {job_id} ended {status}")
        await asyncio.sleep(POLL_S)
    raise RuntimeError(f"job {job_id} not completed {timeout_s:.0f} s after its last byte")


def durable_at(store: Path, job_id: str, timeout_s: float = STATUS_TIMEOUT_S) -> float:
    """The job's `finished_at` (wall clock) in the store's database, once committed.

    Read-only, and only after the job completed: a query holds the server's writer back
    for as long as it reads, a millisecond."""
    deadline = time.monotonic() + timeout_s
    uri = f"file:{store / DATABASE_NAME}?mode=ro"
    while time.monotonic() < deadline:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5.0)) as db:
            row = db.execute(
                "SELECT status, finished_at FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
        if row is not None and row[0] == "completed" and row[1] is not None:
            return float(row[1])
        time.sleep(POLL_S)
    raise RuntimeError(f"job {job_id} has no completed row {timeout_s:.0f} s after its end")


async def one_run(
    session: aiohttp.ClientSession,
    url: str,
    pid: int,
    body: bytes,
    store: Path | None,
) -> dict[str, Any]:
    """Stream the latents once; then the job's `completed` and durable moments."""
    wall_offset = time.time() - time.monotonic()
    cpu_before = cpu_seconds(pid)
    received = await receive(
        session, "POST", f"{url}/v1/videos/stream?fps={FPS}", body, keep_body=False
    )
    if received.status != 200:
        raise RuntimeError(f"HTTP {received.status} from {url}")
    # The one job just run. On the same keep-alive connection, so this request is
    # served only once the stream's handler has returned.
    async with session.get(f"{url}/v1/videos?limit=1") as response:
        job_id = (await response.json())["data"][0]["id"]
    record = received.relative()
    del record["fragment_s"]
    record["id"] = job_id
    record["next_answer_after_last_byte_s"] = time.monotonic() - received.last_byte_at
    record["completed_after_last_byte_s"] = (
        await completed_at(session, url, job_id) - received.last_byte_at
    )
    if store is not None:
        finished = await asyncio.to_thread(durable_at, store, job_id)
        record["durable_after_last_byte_s"] = finished - (received.last_byte_at + wall_offset)
    record["server_cpu_s"] = cpu_seconds(pid) - cpu_before
    record |= await stills_of(session, url, job_id)
    async with session.delete(f"{url}/v1/videos/{job_id}") as response:
        if response.status != 200:
            raise RuntimeError(f"DELETE {job_id}: HTTP {response.status}")
    return record


STILLS = {
    "thumbnail": "variant=thumbnail",
    "spritesheet": "variant=spritesheet",
    "thumbnail_kept": "variant=thumbnail",  # asked again: the image made above
}


async def stills_of(session: aiohttp.ClientSession, url: str, job_id: str) -> dict[str, float]:
    """The finished job's thumbnail and spritesheet, each timed from request to last
    byte: made on first request (from the stored file on the store arm, from memory
    on the other), then the thumbnail again, as kept."""
    record: dict[str, float] = {}
    for name, query in STILLS.items():
        started = time.monotonic()
        async with session.get(f"{url}/v1/videos/{job_id}/content?{query}") as response:
            data = await response.read()
            if response.status != 200:
                raise RuntimeError(f"{name} of {job_id}: HTTP {response.status}")
        record[f"{name}_s"] = time.monotonic() - started
        record[f"{name}_bytes"] = len(data)
    return record


async def measure(
    servers: dict[str, tuple[str, int, Path | None]],
    bodies: dict[str, bytes],
    repeats: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Warm-up runs, then `repeats` repeats of one pair per size: (runs, loads)."""
    runs: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    pids = [pid for _, pid, _ in servers.values()]
    async with client_session() as session:
        for body in bodies.values():
            for _ in range(WARMUP_RUNS):
                for url, pid, store in servers.values():
                    await asyncio.wait_for(one_run(session, url, pid, body, store), RUN_TIMEOUT_S)
        for repeat in range(repeats):
            before = load.sample(pids)
            for position, (size, body) in enumerate(bodies.items()):
                order = ARMS if (repeat + position) % 2 == 0 else ARMS[::-1]
                for arm in order:
                    url, pid, store = servers[arm]
                    run = await asyncio.wait_for(
                        one_run(session, url, pid, body, store), RUN_TIMEOUT_S
                    )
                    runs.append({"repeat": repeat, "size": size, "arm": arm, **run})
                    _say(
                        f"repeat {repeat} {size} {arm:>5}: first byte {run['ttfb_s']:.3f} s, "
                        f"last byte {run['last_byte_s']:.3f} s"
                    )
            loads.append({"repeat": repeat, **load.between(before, load.sample(pids))})
    return runs, loads


def summarize(runs: list[dict[str, Any]], sizes: Sequence[str]) -> dict[str, Any]:
    """Per size: each arm's medians, and per measure the paired ratios' spread and
    verdict."""
    summary: dict[str, Any] = {}
    for size in sizes:
        pairs: dict[int, dict[str, dict[str, Any]]] = {}
        for run in runs:
            if run["size"] == size:
                pairs.setdefault(run["repeat"], {})[run["arm"]] = run
        complete = [pair for _, pair in sorted(pairs.items()) if all(a in pair for a in ARMS)]
        entry: dict[str, Any] = {"pairs": len(complete), "medians_s": {}, "ratios": {}}
        keys = (
            "ttfb_s",
            "ttff_s",
            "last_byte_s",
            "next_answer_after_last_byte_s",
            "completed_after_last_byte_s",
            "server_cpu_s",
            *(f"{name}_s" for name in STILLS),
            *(f"{name}_bytes" for name in STILLS),
        )
        for arm in ARMS:
            entry["medians_s"][arm] = {
                key: statistics.median(pair[arm][key] for pair in complete) for key in keys
            }
        entry["medians_s"]["store"]["durable_after_last_byte_s"] = statistics.median(
            pair["store"]["durable_after_last_byte_s"] for pair in complete
        )
        for name, key in RATIOS.items():
            ratios = [pair["store"][key] / pair["none"][key] for pair in complete]
            spread = Spread.of(ratios)
            differences = [pair["store"][key] - pair["none"][key] for pair in complete]
            entry["ratios"][name] = spread.as_dict() | {
                "per_repeat": ratios,
                "median_difference_s": statistics.median(differences),
            }
            target = TARGETS.get(name)
            if target is not None:
                entry["ratios"][name] |= {
                    "target": target.limit,
                    "median_meets": spread.median <= target.limit,
                    "verdict": verdict(spread, target.limit).value,
                }
        summary[size] = entry
    return summary


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"The store's cost to a viewer of `POST /v1/videos/stream` (`--model tiny`, CPU): "
        f"`--store DIR` against `--store none`, {meta['repeats']} paired repeats, order "
        f"alternating ({meta['finished_utc']}, {meta['wall_s']:.0f} s; load average "
        f"{meta['load_start']} at start; the store on {meta['store_filesystem']}). "
        "Seconds are medians; a ratio is the median of the paired ratios store / no "
        "store, with their IQR and the median paired difference store - no store.",
        "",
        "| size (frames x W x H) | first byte: no store / store / ratio (IQR) | "
        "last byte: no store / store / ratio (IQR) | target | verdict |",
        "|---|---|---|---|---|",
    ]
    for size, entry in result["summary"].items():
        medians, ratios = entry["medians_s"], entry["ratios"]
        cells = []
        for name, key in MEASURES.items():
            r = ratios[name]
            cells.append(
                f"{medians['none'][key]:.3f} s / {medians['store'][key]:.3f} s / "
                f"{r['median']:.3f} ({r['q1']:.2f}-{r['q3']:.2f}; "
                f"{1000 * r['median_difference_s']:+.1f} ms)"
            )
        targets = ", ".join(f"{name} <= {TARGETS[name].limit}" for name in MEASURES)
        verdicts = "; ".join(f"{name}: {explain(ratios[name])}" for name in MEASURES)
        lines.append(f"| {size} | {cells[0]} | {cells[1]} | {targets} | {verdicts} |")
    lines += [
        "",
        "Where else the store shows (medians): the first fragment (ftyp + moov + the "
        "first moof/mdat; a ratio, not judged); after the last byte, the answer to the "
        "next request on the same keep-alive connection (`GET /v1/videos?limit=1`), "
        "`GET /v1/videos/{id}` saying `completed`, and the store's row being durable "
        "(file and folder fsynced, `finished_at` stamped); the server's CPU time per run.",
        "",
        "| size | first fragment: no store / store / ratio (IQR) | next answer after last "
        "byte: no store / store | `completed` after last byte: no store / store | "
        "durable after last byte (store) | server CPU s: no store / store |",
        "|---|---|---|---|---|---|",
    ]
    for size, entry in result["summary"].items():
        none, store = entry["medians_s"]["none"], entry["medians_s"]["store"]
        ratio = entry["ratios"]["first_fragment"]
        lines.append(
            f"| {size} | {none['ttff_s']:.3f} s / {store['ttff_s']:.3f} s / "
            f"{ratio['median']:.3f} ({ratio['q1']:.2f}-{ratio['q3']:.2f}) | "
            f"{_ms_pair(none, store, 'next_answer_after_last_byte_s')} | "
            f"{_ms_pair(none, store, 'completed_after_last_byte_s')} | "
            f"{1000 * store['durable_after_last_byte_s']:.1f} ms | "
            f"{none['server_cpu_s']:.2f} / {store['server_cpu_s']:.2f} |"
        )
    lines += [
        "",
        "A finished job's stills (`/content?variant=thumbnail|spritesheet`), each the "
        "median time from request to last byte, made on first request from the job's "
        "MP4 (the stored file with the store, memory without), then the thumbnail asked "
        "again (kept); and what the two first requests cost against the job's last byte.",
        "",
        "| size | thumbnail (WebP): no store / store | spritesheet (JPEG): no store / store "
        "| thumbnail again | bytes: thumbnail / spritesheet | both / last byte (store) |",
        "|---|---|---|---|---|---|",
    ]
    for size, entry in result["summary"].items():
        none, store = entry["medians_s"]["none"], entry["medians_s"]["store"]
        share = (store["thumbnail_s"] + store["spritesheet_s"]) / store["last_byte_s"]
        lines.append(
            f"| {size} | {_ms_pair(none, store, 'thumbnail_s')} | "
            f"{_ms_pair(none, store, 'spritesheet_s')} | "
            f"{1000 * store['thumbnail_kept_s']:.1f} ms | "
            f"{store['thumbnail_bytes'] / 1000:.1f} kB / "
            f"{store['spritesheet_bytes'] / 1000:.1f} kB | {share:.3f} |"
        )
    others = [entry["others_cores"] for entry in result["loads"]]
    lines += [
        "",
        f"Other processes kept {statistics.median(others):.2f} cores busy per repeat "
        f"(median; {max(others):.2f} at most) on {result['meta']['cpus']} CPUs.",
    ]
    return "\n".join(lines) + "\n"


def serve(
    arm: str, store: Path | None, log_dir: Path
) -> contextlib.AbstractContextManager[tuple[str, subprocess.Popen[bytes]]]:
    """`vaecast serve` on a free port of 127.0.0.1 with `--store` always given (a
    folder, or none), without an API key; yields (URL, process)."""
    command = [sys.executable, "-m", "vaecast", "serve", "--host", "127.0.0.1", "--port", "0"]
    command += ["--model", "tiny", "--device", "cpu", "--store", str(store or "none")]
    env = {k: v for k, v in os.environ.items() if k != "VAECAST_API_KEY"}
    log_path = log_dir / f"server-store-{arm}.log"
    return announced_process(command, log_path, vaecast_serve_url, what="vaecast serve", env=env)


def filesystem_of(path: Path) -> str:
    """The type of the file system `path` is on (its longest mount point in /proc/mounts):
    on tmpfs an fsync costs nothing, on a disk it is the store's main cost."""
    best, kind = "", "unknown"
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1]
        inside = str(path.resolve()).startswith(point.rstrip("/") + "/") or point == "/"
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return f"{kind} ({best})"


def _ms_pair(none: dict[str, float], store: dict[str, float], key: str) -> str:
    return f"{1000 * none[key]:.1f} ms / {1000 * store[key]:.1f} ms"


def _say(text: str) -> None:
    print(f"[store] {text}", flush=True)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.store", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--repeats", type=int, default=15, help="paired repeats (5 or more for a verdict)"
    )
    parser.add_argument(
        "--size", action="append", help=f"FRAMESxWIDTHxHEIGHT (repeatable; default {DEFAULT_SIZES})"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    sizes = args.size or list(DEFAULT_SIZES)
    started = time.monotonic()
    meta: dict[str, Any] = {
        "started_utc": now_utc(),
        "load_start": " ".join(f"{v:.2f}" for v in os.getloadavg()),
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "fps": FPS,
        "server": "vaecast serve --host 127.0.0.1 --port 0 --model tiny --device cpu --store X",
    }
    cache = args.out / "tmp"
    bodies = {size: latents_body(make_latents(*parse_size(size), cache), FPS) for size in sizes}
    with tempfile.TemporaryDirectory(prefix="vaecast-bench-store-") as temp:
        store = Path(temp) / "store"
        meta["store_filesystem"] = filesystem_of(Path(temp))
        with contextlib.ExitStack() as stack:
            servers: dict[str, tuple[str, int, Path | None]] = {}
            for arm, path in (("none", None), ("store", store)):
                url, process = stack.enter_context(serve(arm, path, cache))
                warm_up = asyncio.run(warm_up_ended(url))
                _say(f"--store {path or 'none'} on {url}; demo warm-up {warm_up['state']}")
                servers[arm] = (url, process.pid, path)
            runs, loads = asyncio.run(measure(servers, bodies, args.repeats))
    meta["finished_utc"] = now_utc()
    meta["wall_s"] = time.monotonic() - started
    result = {
        "meta": meta,
        "summary": summarize(runs, sizes),
        "loads": loads,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "store.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (args.out / "store.md").write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main()
