"""Slow clients against fair admission: trickling bodies and empty push sessions.

Nine uploads whose body arrives at 1 byte/s, or nine push sessions that never send a
block, once held every decode place of a default server (1 slot + 8 queued), and
every other POST got 429 for as long as they cared to stay. Fair admission holds
them in pending places (`--max-pending`), at most `--max-pending-per-client` of them
for one client, for a bounded time: a body under `--min-body-rate` past
`--body-rate-grace` is refused with 408, a session with no block fails
(`push_timeout`) after `--push-first-block-timeout`.

Each category starts its own `vaecast serve` (`vaecast_serve`) with the default
decode places, room for the nine and one more, and those bounds small (grace 1 s,
first block 2 s) so a round takes seconds. Per round: nine slow clients (each body
from an address of its own, 127.0.0.2 and up; the nine sessions from one, which gets
its share and a 429 past it) hold their places (/healthz `places`); meanwhile a normal
upload from 127.0.0.1 is admitted (201) within ADMISSION_BOUND_S and decoded; then the
slow ones end as they must, no later than LATE_BOUND_S past their bound, and their
places are free again. Figures: the normal
upload's admission latency, how long each trickle took to get its 408, how long
each empty session lived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from chaos import files
from chaos.results import Category, Finding
from chaos.vaecast_serve import (
    DidNotStart,
    Serve,
    figures_of,
    final_job,
    json_of,
    session,
    store_options,
    vaecast_serve,
)

TRICKLING = "trickling bodies (fair admission)"
EMPTY_PUSH = "empty push sessions (fair admission)"
SLOW_CLIENTS = 9
SHARE = 8  # --max-pending-per-client's default: what one client's sessions may hold
DECODE_PLACES = ("--decode-slots", "1", "--max-queued", "8")  # the defaults, said aloud
MAX_PENDING = SLOW_CLIENTS + 1
MIN_BODY_RATE = 65536
GRACE_S = 1.0
FIRST_BLOCK_TIMEOUT_S = 2.0
ADMISSION_BOUND_S = 1.0
# How much past its bound (the grace, the first-block timeout) a slow client may end.
LATE_BOUND_S = 1.5
HELD_TIMEOUT_S = 10.0  # for the nine to be seen holding their places
ANSWER_TIMEOUT_S = 10.0
TRICKLE_BYTES_MAX = 30  # a trickle sends at most this many bytes: refused long before
POLL_S = 0.05
# Figures of how the slow clients ended: what they got, and the bound they had.
ENDINGS = {
    "time_to_408_s": ("408", f"grace {GRACE_S:g} s"),
    "time_to_push_timeout_s": ("push_timeout", f"first-block timeout {FIRST_BLOCK_TIMEOUT_S:g} s"),
}


def run(rounds: int, work_dir: Path, seed: int, say: Callable[[str], None]) -> list[Category]:
    say(f"trickling bodies: {SLOW_CLIENTS} uploads at 1 byte/s, {rounds} round(s)")
    trickling = asyncio.run(_category(TRICKLING, trickling_bodies, rounds, work_dir, seed))
    say(f"empty push sessions: {SLOW_CLIENTS} sessions with no block, {rounds} round(s)")
    empty = asyncio.run(_category(EMPTY_PUSH, empty_push_sessions, rounds, work_dir, seed))
    return [trickling, empty]


RoundFn = Callable[[Serve, aiohttp.ClientSession, bytes, Category, dict[str, list[Any]]], Any]


async def _category(
    name: str, round_fn: RoundFn, rounds: int, work_dir: Path, seed: int
) -> Category:
    """`rounds` of `round_fn` against one server of its own, then its exit and log."""
    category = Category(name)
    measured: dict[str, list[Any]] = {}
    options = store_options(
        work_dir / f"store-{round_fn.__name__}",
        *DECODE_PLACES,
        *("--max-pending", str(MAX_PENDING), "--min-body-rate", str(MIN_BODY_RATE)),
        *("--body-rate-grace", str(GRACE_S)),
        *("--push-first-block-timeout", str(FIRST_BLOCK_TIMEOUT_S)),
    )
    upload = files.small_latents(2, 8, 8, seed)
    try:
        with vaecast_serve(options, work_dir, f"{round_fn.__name__}.log") as serve:
            async with session(serve.url) as client:
                for _ in range(rounds):
                    await round_fn(serve, client, upload, category, measured)
            code = serve.stop()
            trouble = serve.trouble()
    except DidNotStart as error:
        started = Finding("the server did not start", " ".join(options), str(error), "it starts")
        category.record(started)
        return category
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        failed = Finding("a request failed", " ".join(options), repr(error), "it answers")
        category.record(failed)
        return category
    category.record(None if code == 0 else Finding("unclean exit", "SIGTERM", str(code), "0"))
    category.record(
        None
        if not trouble
        else Finding(
            "log: trouble lines",
            "the whole run",
            f"{len(trouble)} lines, first: {' / '.join(trouble[:3])}",
            "no traceback or async defect",
        )
    )
    category.figures = {"flags": " ".join(options[options.index("--retention") :])}
    for key, values in measured.items():
        if key == "admission_s":
            in_ms = [1000 * v for v in values]
            category.figures["admission_ms"] = {**figures_of(in_ms, 1), "each": _rounded(in_ms, 1)}
        elif key.endswith("_s"):
            category.figures[key] = {**figures_of(values), "each": _rounded(values, 3)}
        else:  # messages: the distinct ones
            category.figures[key] = list(dict.fromkeys(values))[:3]
    admission = category.figures.get("admission_ms", figures_of([]))
    category.headline = (
        f"{SLOW_CLIENTS} slow clients x {rounds} round(s); normal upload admitted in "
        f"{admission['median']} ms median, {admission['max']} ms max "
        f"(bound {1000 * ADMISSION_BOUND_S:g} ms)"
    )
    for key, (outcome, bound) in ENDINGS.items():
        if key in category.figures:
            ended = category.figures[key]
            category.headline += (
                f"; {outcome} after {ended['min']}-{ended['max']} s "
                f"(median {ended['median']} s; {bound})"
            )
    return category


async def trickling_bodies(
    serve: Serve,
    client: aiohttp.ClientSession,
    upload: bytes,
    category: Category,
    measured: dict[str, list[Any]],
) -> None:
    """Nine uploads at 1 byte/s; a normal upload while they trickle; their 408s."""
    host, port = serve.url.removeprefix("http://").split(":")
    trickles = [
        asyncio.create_task(_trickle(host, int(port), upload, f"127.0.0.{2 + index}"))
        for index in range(SLOW_CLIENTS)
    ]
    try:
        places = await _until_held(client, "receiving", SLOW_CLIENTS)
        category.record(
            _held(places, "receiving", SLOW_CLIENTS, "while 9 bodies trickle at 1 byte/s")
        )
        await _admission(client, upload, category, measured, "while 9 bodies trickle")
        answers = await asyncio.gather(*trickles)  # each bounded: see _trickle
    finally:
        for task in trickles:
            task.cancel()
    late = GRACE_S + LATE_BOUND_S
    for status, body, seconds in answers:
        error = body.get("error") or {}
        measured.setdefault("time_to_408_s", []).append(seconds)
        ok = status == 408 and error.get("type") == "request_timeout" and seconds <= late
        if status == 408:
            measured.setdefault("408_messages", []).append(error.get("message"))
        category.record(
            None
            if ok
            else Finding(
                "a trickling body did not end with a timely 408",
                f"POST /v1/videos, {len(upload)}-byte body at 1 byte/s",
                f"{status} {body} after {seconds:.2f} s",
                f"408 request_timeout within {late:g} s",
            )
        )
    places = await _until_freed(client, "receiving")
    category.record(_freed(places, "receiving", "after the trickles' 408s"))


async def empty_push_sessions(
    serve: Serve,
    client: aiohttp.ClientSession,
    upload: bytes,
    category: Category,
    measured: dict[str, list[Any]],
) -> None:
    """Nine push sessions that send no block, from one client: its share opens, the
    rest is 429; a normal upload from another; their push_timeout."""
    loop = asyncio.get_running_loop()
    created: dict[str, float] = {}
    async with session(serve.url, source="127.0.0.2") as pusher:
        for index in range(SLOW_CLIENTS):
            async with pusher.post("/v1/videos", json={"input": "push"}) as response:
                body = await json_of(response)
            if response.status == 201:
                created[body["id"]] = loop.time()
            expected = 201 if index < SHARE else 429
            category.record(
                None
                if response.status == expected
                else Finding(
                    "a push session was refused" if expected == 201 else "past its share",
                    f'POST /v1/videos {{"input": "push"}}, the session {index + 1} of one client',
                    f"{response.status} {body}",
                    str(expected),
                )
            )
    places = await _until_held(client, "push_waiting", SHARE)
    category.record(_held(places, "push_waiting", SHARE, "with 8 push sessions and no block"))
    await _admission(client, upload, category, measured, "while 9 push sessions have no block")
    late = FIRST_BLOCK_TIMEOUT_S + LATE_BOUND_S
    for job_id, since in created.items():
        left_s = since + late + ANSWER_TIMEOUT_S - loop.time()
        status, body = await final_job(client, job_id, left_s)
        lived = loop.time() - since
        error = body.get("error") or {}
        measured.setdefault("time_to_push_timeout_s", []).append(lived)
        early = FIRST_BLOCK_TIMEOUT_S - 2 * POLL_S
        ok = body.get("status") == "failed" and error.get("type") == "push_timeout"
        category.record(
            None
            if ok and early <= lived <= late
            else Finding(
                "an empty push session did not time out on time",
                f"GET /v1/videos/{job_id}, a push session with no block",
                f"{status} {body.get('status')} {error} after {lived:.2f} s",
                f"failed push_timeout after {FIRST_BLOCK_TIMEOUT_S:g} to {late:g} s",
            )
        )
        if ok:
            measured.setdefault("push_timeout_messages", []).append(error.get("message"))
    places = await _until_freed(client, "push_waiting")
    category.record(_freed(places, "push_waiting", "after the sessions timed out"))


async def _admission(
    client: aiohttp.ClientSession,
    upload: bytes,
    category: Category,
    measured: dict[str, list[Any]],
    while_: str,
) -> None:
    """A normal upload: 201 within ADMISSION_BOUND_S, then decoded to the end."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with client.post("/v1/videos", data=upload) as response:
        body = await json_of(response)
    seconds = loop.time() - started
    measured.setdefault("admission_s", []).append(seconds)
    admitted = response.status == 201 and seconds < ADMISSION_BOUND_S
    category.record(
        None
        if admitted
        else Finding(
            "a normal upload was not admitted in time",
            f"POST /v1/videos ({len(upload)} bytes) {while_}",
            f"{response.status} {body.get('error', '')} after {1000 * seconds:.0f} ms",
            f"201 within {1000 * ADMISSION_BOUND_S:g} ms",
        )
    )
    if response.status == 201:
        status, job = await final_job(client, body["id"], 30.0)
        category.record(
            None
            if job.get("status") == "completed"
            else Finding(
                "the admitted upload was not decoded",
                f"GET /v1/videos/{body['id']}",
                f"{status} {job}",
                "completed",
            )
        )


async def _trickle(
    host: str, port: int, body: bytes, source: str
) -> tuple[int, dict[str, Any], float]:
    """POST `body` one byte a second over a raw socket from the address `source`: the
    answer and how long it took from the first byte (status 0: no answer, with what
    happened instead)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    head = f"POST /v1/videos HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n"
    started = loop.time()
    writer.write(head.encode() + body[:1])
    answer = asyncio.ensure_future(_read_answer(reader))
    try:
        for position in range(1, min(len(body), TRICKLE_BYTES_MAX)):
            done, _ = await asyncio.wait({answer}, timeout=1.0)
            if done:
                break
            with contextlib.suppress(ConnectionError):
                writer.write(body[position : position + 1])
                await writer.drain()
        status, parsed = await asyncio.wait_for(answer, ANSWER_TIMEOUT_S)
    except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError) as error:
        status, parsed = 0, {"error": {"type": "no answer", "message": repr(error)}}
    finally:
        answer.cancel()
        writer.close()
    return status, parsed, loop.time() - started


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    data = await reader.readexactly(int(headers.get("content-length", "0")))
    try:
        return status, dict(json.loads(data))
    except ValueError:
        return status, {"body": data[:200].decode(errors="replace")}


async def _places(client: aiohttp.ClientSession) -> dict[str, Any]:
    async with client.get("/healthz") as response:
        return dict((await json_of(response)).get("places") or {})


async def _until_held(client: aiohttp.ClientSession, kind: str, count: int) -> dict[str, Any]:
    """/healthz places once `kind` counts `count` (or at HELD_TIMEOUT_S)."""
    return await _until(client, lambda places: places.get(kind) == count)


async def _until_freed(client: aiohttp.ClientSession, kind: str) -> dict[str, Any]:
    return await _until(client, lambda places: places.get(kind) == 0)


async def _until(
    client: aiohttp.ClientSession, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + HELD_TIMEOUT_S
    while True:
        places = await _places(client)
        if done(places) or asyncio.get_running_loop().time() > deadline:
            return places
        await asyncio.sleep(POLL_S)


def _held(places: dict[str, Any], kind: str, count: int, when: str) -> Finding | None:
    if places.get(kind) == count and places.get("queued") == 0:
        return None
    return Finding(
        "the slow clients did not hold pending places of their own",
        f"GET /healthz {when}",
        f"places {places}",
        f"{kind} {count}, queued 0",
    )


def _freed(places: dict[str, Any], kind: str, when: str) -> Finding | None:
    if places.get(kind) == 0:
        return None
    return Finding(
        "pending places were not given back",
        f"GET /healthz {when}",
        f"places {places}",
        f"{kind} 0 within {HELD_TIMEOUT_S:g} s",
    )


def _rounded(values: list[float], digits: int) -> list[float]:
    return [round(value, digits) for value in values]
