"""Kill and restart on a durable store, and a damaged store at startup.

Kill and restart: `vaecast serve --store DIR` (`vaecast_serve`) takes tiny-model jobs
from a client that keeps posting (most jobs short, one per round long enough to be
decoding at the kill) while a watcher fetches every job it sees completed; then it is
SIGKILLed at a random moment (seeded) and started again on the same store, round
after round. After each start every job the client got a 201 for is judged:
- it exists (200, never 404);
- one seen completed before a kill serves the same bytes (sha256) and ETag;
- one not seen completed is either completed or failed with error type
  `interrupted` (it was queued or decoding at the kill; a job that finished between
  the watcher's last look and the kill is rightly completed);
- no completed job has a short file: its content is `bytes` long and decodes (PyAV)
  to the frames its latents make (1 + 4 (T - 1)).
The store promises this because a 201 is sent only once the job's row is committed
and a job is marked completed only after its file is fsynced.

Damaged store: a server stopped cleanly, and its store damaged while it is down. A
finished job's `videos/<id>.mp4` cut short: the next start drops that job (410,
"lost"), serves the other as before, logs one line with `completed=1 dropped=1` and
counts both in `vaecast_store_recovered_total`. `jobs.db` overwritten with garbage:
the next start moves it aside (`jobs.db.corrupt-*`), logs one line saying so, removes
the video file no record names any more (counted as `orphan_files`), knows the old
job no more (404) and decodes new jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import av

from chaos import files
from chaos.results import Category, Finding
from chaos.vaecast_serve import (
    DidNotStart,
    Serve,
    figures_of,
    final_job,
    job_of,
    json_of,
    metrics,
    session,
    store_options,
    vaecast_serve,
)

KILLED = "kill and restart (durable store)"
DAMAGED = "damaged store at startup"
KILLS_LOG = "kill-and-restart.log"
DAMAGE_LOG = "damaged-store.log"
# When the kill comes, after the round's first POST (uniform, seconds).
KILL_DELAY_S = (0.1, 1.5)
JOBS_PER_ROUND = 10
SHORT_LATENT_FRAMES = (2, 12)
SHORT_LATENT_SIDE = 8  # 64 x 64 pixels
LONG_JOB = (64, 24)  # latent frames, side: 253 frames of 192 x 192, about a second
POLL_S = 0.05
POST_ATTEMPTS = 200  # 429s waited out per job (the queue is full), POLL_S apart
FINISH_TIMEOUT_S = 30.0
JUDGE_CONCURRENCY = 8
RECOVERED = "vaecast_store_recovered_total"


@dataclass
class Sent:
    """A job the client got a 201 for, and what it knows of it."""

    id: str
    frames: int  # what its latents make
    round: int  # the start it was created in
    content: tuple[str, str] | None = None  # sha256 and ETag, once seen completed
    decoded: bool = False  # its whole file was checked with PyAV once
    interrupted: bool = False  # seen failed `interrupted` after a restart


def run(kills: int, work_dir: Path, seed: int, say: Callable[[str], None]) -> list[Category]:
    say(f"kill and restart: {kills} SIGKILLs of vaecast serve on one store")
    killed = asyncio.run(kill_and_restart(kills, work_dir, seed))
    say("damaged store at startup: a cut video file, a corrupt jobs.db")
    damaged = asyncio.run(damaged_store(work_dir, seed))
    return [killed, damaged]


# Kill and restart.


async def kill_and_restart(kills: int, work_dir: Path, seed: int) -> Category:
    category = Category(KILLED)
    store = work_dir / "store-killed"
    rng = random.Random(seed)
    sent: dict[str, Sent] = {}
    tally: Counter[str] = Counter()
    start_s: list[float] = []
    kill_delays: list[float] = []
    trouble: list[str] = []
    for start in range(kills + 1):  # the start after the last kill judges it
        request = f"start {start} of vaecast serve on the store, after {start} SIGKILLs"
        try:
            with vaecast_serve(store_options(store), work_dir, KILLS_LOG) as serve:
                category.record(None)
                tally["started"] += 1
                start_s.append(serve.start_s)
                async with session(serve.url) as client:
                    await _judge(client, sent, start, category, tally)
                    if start < kills:
                        delay = rng.uniform(*KILL_DELAY_S)
                        kill_delays.append(delay)
                        await _load_then_kill(client, serve, rng, sent, start, delay, category)
                    else:
                        code = serve.stop()
                        category.record(
                            None
                            if code == 0
                            else Finding("unclean exit", f"SIGTERM, {request}", f"{code}", "0")
                        )
                trouble += serve.trouble()
        except DidNotStart as error:
            category.record(
                Finding("the server did not start", request, str(error)[-800:], "it starts")
            )
            break
        except (aiohttp.ClientError, TimeoutError) as error:
            category.record(
                Finding("the server stopped answering", request, repr(error), "it answers")
            )
            break
    category.record(
        None
        if not trouble
        else Finding(
            "log: trouble lines",
            "every start",
            f"{len(trouble)} lines, first: {' / '.join(trouble[:3])}",
            "no traceback or async defect",
        )
    )
    category.figures = {
        "kills": len(kill_delays),
        "starts": len(start_s),
        "jobs_created": len(sent),
        "start_s": figures_of(start_s),
        "kill_delay_s": figures_of(kill_delays),
        "checks": dict(tally),
        "jobs_interrupted": sum(job.interrupted for job in sent.values()),
        "jobs_completed": sum(job.content is not None for job in sent.values()),
    }
    starts, delays = category.figures["start_s"], category.figures["kill_delay_s"]
    category.headline = (
        f"{len(kill_delays)} SIGKILLs {delays['min']}-{delays['max']} s into a round, "
        f"{len(start_s)} starts (median {starts['median']} s, max {starts['max']} s); "
        f"{len(sent)} jobs given 201: {category.figures['jobs_completed']} completed "
        f"(same sha256 and ETag after every later restart), "
        f"{category.figures['jobs_interrupted']} failed interrupted"
    )
    return category


async def _load_then_kill(
    client: aiohttp.ClientSession,
    serve: Serve,
    rng: random.Random,
    sent: dict[str, Sent],
    start: int,
    delay_s: float,
    category: Category,
) -> None:
    """Post this round's jobs and fetch each one seen completed, until the SIGKILL
    `delay_s` after the start of it; what failed before the kill is a finding."""
    plan = [LONG_JOB] + [
        (rng.randint(*SHORT_LATENT_FRAMES), SHORT_LATENT_SIDE) for _ in range(JOBS_PER_ROUND - 1)
    ]
    rng.shuffle(plan)
    mine: list[Sent] = []
    killed = asyncio.Event()
    problems: list[Finding] = []

    def problem(key: str, request: str, answer: str, expected: str) -> None:
        if not killed.is_set():  # after the kill every request fails, as it should
            problems.append(Finding(key, request, answer, expected))

    async def create() -> None:
        for latent_frames, side in plan:
            body = files.small_latents(latent_frames, side, side, seed=len(sent))
            request = f"POST /v1/videos ({latent_frames} latent frames of {side}x{side})"
            try:
                answer = await _post(client, body)
            except (aiohttp.ClientError, TimeoutError) as error:
                problem("a request failed while the server ran", request, repr(error), "201")
                return
            if answer is None:
                problem("still 429 after every retry", request, "429", "201 once it drains")
                continue
            status, job = answer
            if status != 201:
                problem("a valid job was refused", request, f"{status} {job}", "201")
                continue
            frames = files.video_frames(latent_frames)
            mine.append(sent.setdefault(job["id"], Sent(job["id"], frames, start)))

    async def watch() -> None:
        while True:
            for job in [j for j in mine if j.content is None]:
                request = f"GET /v1/videos/{job.id}"
                try:
                    _, body = await job_of(client, job.id)
                    if body.get("status") != "completed":
                        continue
                    data, etag = await _content(client, job.id)
                except (aiohttp.ClientError, TimeoutError) as error:
                    problem("a request failed while the server ran", request, repr(error), "200")
                    continue
                if len(data) != body.get("bytes"):
                    problem(
                        "a completed job's content is short",
                        f"{request}/content",
                        f"{len(data)} bytes",
                        f"{body.get('bytes')} bytes",
                    )
                job.content = (hashlib.sha256(data).hexdigest(), etag)
            await asyncio.sleep(POLL_S)

    tasks = [asyncio.create_task(create()), asyncio.create_task(watch())]
    try:
        await asyncio.sleep(delay_s)
    finally:
        killed.set()
        serve.kill()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for finding in problems:
        category.record(finding)


async def _judge(
    client: aiohttp.ClientSession,
    sent: dict[str, Sent],
    start: int,
    category: Category,
    tally: Counter[str],
) -> None:
    """Every job created so far, as this start serves it (see the module docstring)."""
    limit = asyncio.Semaphore(JUDGE_CONCURRENCY)

    async def one(job: Sent) -> Finding | None:
        async with limit:
            return await _judge_one(client, job, start, tally)

    for finding in await asyncio.gather(*(one(job) for job in sent.values())):
        category.record(finding)


async def _judge_one(
    client: aiohttp.ClientSession, job: Sent, start: int, tally: Counter[str]
) -> Finding | None:
    request = f"GET /v1/videos/{job.id} at start {start} (created at start {job.round})"
    status, body = await job_of(client, job.id)
    tally["exists"] += 1
    if status != 200:
        key = "a job given 201 is gone after a restart" if status == 404 else "job not served"
        return Finding(key, request, f"{status} {body}", "200")
    state, error = body.get("status"), (body.get("error") or {}).get("type")
    if job.content is None and state == "failed" and error == "interrupted":
        job.interrupted = True
        tally["interrupted"] += 1
        return None
    if state != "completed":
        expected = "completed, as before the kill" if job.content else "completed, or interrupted"
        key = "a job completed before a kill is not completed after it"
        if job.content is None:
            key = "a job unfinished at the kill is neither completed nor interrupted"
        return Finding(key, request, f"{state} ({error})", expected)
    data, etag = await _content(client, job.id)
    digest = hashlib.sha256(data).hexdigest()
    if job.content is not None:
        tally["same bytes and ETag"] += 1
        if (digest, etag) != job.content:
            return Finding(
                "a completed video changed across a restart",
                f"{request}/content",
                f"sha256 {digest[:16]}, ETag {etag}",
                f"sha256 {job.content[0][:16]}, ETag {job.content[1]} (before the kill)",
            )
    else:
        tally["completed in the kill window"] += 1
        job.content = (digest, etag)
    if job.decoded:
        return None
    job.decoded = True
    tally["whole file"] += 1
    frames = _decoded_frames(data)
    if len(data) != body.get("bytes") or frames != job.frames:
        return Finding(
            "a completed job has a short file",
            f"{request}/content",
            f"{len(data)} bytes, {frames} frames decoded",
            f"{body.get('bytes')} bytes, {job.frames} frames",
        )
    return None


# A damaged store at startup.


async def damaged_store(work_dir: Path, seed: int) -> Category:
    category = Category(DAMAGED)
    figures: dict[str, Any] = {}
    for name, damage in (("cut video file", _cut_file), ("corrupt jobs.db", _corrupt_db)):
        try:
            figures[name] = await damage(work_dir, seed, category)
        except DidNotStart as error:
            category.record(
                Finding(
                    f"the server did not start ({name})",
                    f"vaecast serve on a store with a {name}",
                    str(error)[-800:],
                    "it starts",
                )
            )
        except (aiohttp.ClientError, TimeoutError, AssertionError) as error:
            category.record(
                Finding(
                    f"a request failed ({name})",
                    f"setting up or judging a store with a {name}",
                    repr(error)[:800],
                    "every request answered as the store promises",
                )
            )
    category.figures = figures
    category.headline = "; ".join(
        f"{name}: restart {found['restart_s']} s, recovered {found['recovered']}"
        for name, found in figures.items()
    )
    return category


async def _cut_file(work_dir: Path, seed: int, category: Category) -> dict[str, Any]:
    store = work_dir / "store-cut-file"
    with vaecast_serve(store_options(store), work_dir, DAMAGE_LOG) as serve:
        async with session(serve.url) as client:
            cut = await _finished(client, files.small_latents(4, 8, 8, seed))
            kept = await _finished(client, files.small_latents(6, 8, 8, seed + 1))
        serve.stop()
    path = store / "videos" / f"{cut['id']}.mp4"
    size = path.stat().st_size
    with path.open("r+b") as video:
        video.truncate(size // 2)
    with vaecast_serve(store_options(store), work_dir, DAMAGE_LOG) as serve:
        category.record(None)  # it started
        async with session(serve.url) as client:
            status, body = await job_of(client, cut["id"])
            message = (body.get("error") or {}).get("message", "")
            category.record(
                None
                if status == 410 and "lost" in message
                else Finding(
                    "a job whose file was cut is still served",
                    f"GET /v1/videos/{cut['id']} after cutting its file to {size // 2} of "
                    f"{size} bytes",
                    f"{status} {body}",
                    "410, its video file was lost",
                )
            )
            category.record(await _same_as_before(client, kept, "the intact job, after the cut"))
            counted = _recovered(await metrics(client))
        serve.stop()
        lines = [line for line in serve.log_lines() if "job(s) kept" in line]
    expected = {"completed": 1.0, "dropped": 1.0}
    category.record(_counted(counted, expected, "after cutting one of two files"))
    said = len(lines) == 1 and "completed=1" in lines[0] and "dropped=1" in lines[0]
    category.record(
        None
        if said
        else Finding(
            "the start did not say what it dropped",
            "the store log line of the start after the cut",
            " / ".join(lines) or "no such line",
            "one line with completed=1 and dropped=1",
        )
    )
    return {"restart_s": serve.start_s, "log": lines, "recovered": counted}


async def _corrupt_db(work_dir: Path, seed: int, category: Category) -> dict[str, Any]:
    store = work_dir / "store-corrupt-db"
    with vaecast_serve(store_options(store), work_dir, DAMAGE_LOG) as serve:
        async with session(serve.url) as client:
            old = await _finished(client, files.small_latents(4, 8, 8, seed + 2))
        serve.stop()
    garbage = random.Random(seed).randbytes(8192)
    (store / "jobs.db").write_bytes(garbage)
    for suffix in ("-wal", "-shm"):
        (store / f"jobs.db{suffix}").unlink(missing_ok=True)
    orphans = len(list((store / "videos").iterdir()))
    with vaecast_serve(store_options(store), work_dir, DAMAGE_LOG) as serve:
        category.record(None)  # it started
        async with session(serve.url) as client:
            status, body = await job_of(client, old["id"])
            category.record(
                None
                if status == 404
                else Finding(
                    "a job whose record went aside is still known",
                    f"GET /v1/videos/{old['id']} after overwriting jobs.db",
                    f"{status} {body}",
                    "404",
                )
            )
            try:
                new = await _finished(client, files.small_latents(3, 8, 8, seed + 3))
                category.record(None)
            except AssertionError as error:
                new = {}
                category.record(
                    Finding(
                        "no new job after a corrupt database",
                        "POST /v1/videos",
                        str(error),
                        "completed",
                    )
                )
            counted = _recovered(await metrics(client))
        serve.stop()
        lines = [line for line in serve.log_lines() if "moved it to" in line]
    category.record(_counted(counted, {"orphan_files": float(orphans)}, "after jobs.db"))
    aside = sorted(p.name for p in store.glob("jobs.db.corrupt-*"))
    # The database, with its journal beside it when it has one.
    databases = [name for name in aside if not name.endswith(("-journal", "-wal"))]
    said = len(lines) == 1 and "could not be used" in lines[0]
    category.record(
        None
        if said and len(databases) == 1
        else Finding(
            "the corrupt database was not moved aside and said so",
            "the start after overwriting jobs.db",
            f"log: {' / '.join(lines) or 'no such line'}; aside: {aside}",
            "one line saying it could not be used and where it went; one jobs.db.corrupt-* "
            "database",
        )
    )
    return {
        "restart_s": serve.start_s,
        "log": lines,
        "moved_aside": aside,
        "recovered": counted,
        "new_job": new.get("status"),
    }


def _recovered(samples: dict[str, float]) -> dict[str, float]:
    prefix = RECOVERED + '{outcome="'
    return {
        name.removeprefix(prefix).removesuffix('"}'): value
        for name, value in samples.items()
        if name.startswith(prefix) and value
    }


def _counted(counted: dict[str, float], expected: dict[str, float], when: str) -> Finding | None:
    if all(counted.get(outcome) == value for outcome, value in expected.items()):
        return None
    return Finding(
        "the recovery is not counted in /metrics",
        f"GET /metrics {when}",
        f"{RECOVERED} {counted}",
        f"{RECOVERED} with {expected}",
    )


async def _same_as_before(
    client: aiohttp.ClientSession, job: dict[str, Any], what: str
) -> Finding | None:
    status, body = await job_of(client, job["id"])
    if status != 200 or body.get("status") != "completed":
        request = f"GET {job['urls']['self']} ({what})"
        return Finding("an intact job was lost", request, f"{status} {body}", "200 completed")
    data, etag = await _content(client, job["id"])
    before = (job["sha256"], job["etag"])
    if (hashlib.sha256(data).hexdigest(), etag) != before:
        return Finding(
            "an intact job changed",
            f"GET {job['urls']['content']} ({what})",
            f"sha256 {hashlib.sha256(data).hexdigest()[:16]}, ETag {etag}",
            f"sha256 {before[0][:16]}, ETag {before[1]}",
        )
    return None


# Requests.


async def _post(client: aiohttp.ClientSession, body: bytes) -> tuple[int, dict[str, Any]] | None:
    """POST /v1/videos, waiting out 429s (a full queue); None if it never drained."""
    for _ in range(POST_ATTEMPTS):
        async with client.post("/v1/videos", data=body) as response:
            if response.status == 429:
                await response.read()
                await asyncio.sleep(POLL_S)
                continue
            return response.status, await json_of(response)
    return None


async def _content(client: aiohttp.ClientSession, job_id: str) -> tuple[bytes, str]:
    async with client.get(f"/v1/videos/{job_id}/content") as response:
        return await response.read(), response.headers.get("ETag", "")


async def _finished(client: aiohttp.ClientSession, body: bytes) -> dict[str, Any]:
    """A job decoded to the end, with its content's sha256 and ETag; AssertionError
    if it is refused or does not complete in FINISH_TIMEOUT_S."""
    answer = await _post(client, body)
    assert answer is not None and answer[0] == 201, f"POST /v1/videos answered {answer}"
    status, job = await final_job(client, answer[1]["id"], FINISH_TIMEOUT_S)
    assert job.get("status") == "completed", f"{status} {job}"
    data, etag = await _content(client, job["id"])
    return {**job, "sha256": hashlib.sha256(data).hexdigest(), "etag": etag}


def _decoded_frames(data: bytes) -> int:
    """Frames PyAV decodes from an MP4 (-1: it could not be read at all)."""
    with (
        contextlib.suppress(av.error.FFmpegError, ValueError),
        av.open(io.BytesIO(data)) as container,
    ):
        return sum(1 for _ in container.decode(video=0))
    return -1
