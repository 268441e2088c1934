"""What "preview, then final" buys a viewer and what it costs: jobs with and without one.

    python -m benchmarks.preview [--repeats 20] [--size 81x832x480 --size 33x416x240]
                                 [--out benchmarks/results]

Why: a job that names a preview decoder (`preview=linear` for `tiny`) decodes its
latents twice in one decode slot, the fast preview first (on one device the final
yields to it chunk by chunk, so an upload's final should decode once its preview
has; the cross-checks count the jobs where it did not), then the model's full
decoder. The point is that the preview's first frame reaches a
viewer much earlier than the final's would without a preview; the price is the
preview's decode and encode on top of the final's, and a final that starts later.
This measures both, at an HTTP client on loopback.

How: one `vaecast serve --model tiny --device cpu --store none` on 127.0.0.1 (the
store's `serve`: `--store none` always, no API key), past its demo warm-up. Each
repeat uploads the same latents twice, per size, back to back: once with
`?preview=linear`, once with `?preview=none`, the order alternating from repeat to
repeat (and from size to size), so the two jobs of a pair meet the same machine load.
Each run starts its clock before `POST /v1/videos`; as soon as the job exists it opens
a viewer of `/content` (the final) and, with a preview, one of
`/content?variant=preview` (`client.receive`, box by box: a first fragment is ftyp +
moov + the first moof/mdat complete at the client), and `/events` from its start
(`Last-Event-ID: 0`), which gives the client's moments of each variant's first
`chunk` event, `final_ready`, `preview_done`, `final_done` and `done`. The time to a
first fragment is the viewer's (the SSE chunk events are a cross-check); the total is
the `done` event's arrival. The server's CPU time per job is its process's user +
system time (/proc) from before the POST to after the viewers' last byte (jobs never
overlap). The job object's own numbers (`variants.*.time_to_first_fragment_s`,
`ready_after_preview_s`, `timings.total_s`; from the job's creation) are kept too.

Every ratio is computed within a pair (with preview / without, unless named
otherwise) and reported as the median and IQR over the repeats; the two targets are
judged as `paired.verdict` does (median and IQR against the limit, fewer than
`paired.MIN_REPEATS` repeats decide nothing), printed, never asserted. Every wait is
bounded: the server's start and stop (`client`), its warm-up (`demo_click`), each run
(`RUN_TIMEOUT_S`, which also bounds the viewers and the event stream), each HTTP call
(`client.HTTP_TIMEOUT_S`). Every job is deleted after its run.

Writes `preview.json` (every run) and `preview.md` (the tables) to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks import load
from benchmarks.arms import now_utc
from benchmarks.client import (
    Received,
    client_session,
    cpu_seconds,
    latents_body,
    make_latents,
    receive,
)
from benchmarks.demo_click import warm_up_ended
from benchmarks.models import _commit
from benchmarks.paired import Spread, Target, explain, verdict
from benchmarks.store import DEFAULT_OUT, DEFAULT_SIZES, FPS, parse_size, serve

PREVIEW = "linear"  # the parameter-free preview of `tiny`'s latents
ARMS = ("none", PREVIEW)  # the baseline first: ratios are with preview / without
WARMUP_RUNS = 1  # per arm and size: first calls, the previews' threads
RUN_TIMEOUT_S = 120.0  # one job, its viewers and its events (a run takes seconds)
MOMENTS = ("final_ready", "preview_done", "final_done", "done")  # SSE events timed

# name: (numerator, denominator), each (arm, key of the run); and a title.
RATIOS: dict[str, tuple[tuple[str, str], tuple[str, str], str]] = {
    "preview_first_fragment": (
        (PREVIEW, "preview_ttff_s"),
        ("none", "final_ttff_s"),
        "preview's first fragment / the no-preview job's first fragment",
    ),
    "final_first_fragment": (
        (PREVIEW, "final_ttff_s"),
        ("none", "final_ttff_s"),
        "final's first fragment, with preview / without",
    ),
    "preview_over_own_final": (
        (PREVIEW, "preview_ttff_s"),
        (PREVIEW, "final_ttff_s"),
        "preview's first fragment / its own job's final first fragment",
    ),
    "done": (
        (PREVIEW, "done_s"),
        ("none", "done_s"),
        "`done`, with preview / without",
    ),
    "server_cpu": (
        (PREVIEW, "server_cpu_s"),
        ("none", "server_cpu_s"),
        "server CPU time per job, with preview / without",
    ),
}
TARGETS: dict[str, Target] = {
    "preview_first_fragment": Target(0.5, RATIOS["preview_first_fragment"][2]),
    "done": Target(1.5, RATIOS["done"][2]),
}
# Seconds of the preview job alone: its server's and its client's view of final_ready.
READY_KEYS = ("ready_after_preview_s", "final_ready_after_preview_client_s")


async def event_moments(
    session: aiohttp.ClientSession, events_url: str, started: float
) -> dict[str, Any]:
    """Seconds after `started` at which the client got each variant's `chunk` events
    and each of MOMENTS, read from the job's first event on; and how the job ended."""
    chunks: dict[str, list[float]] = {"preview": [], "final": []}
    moments: dict[str, Any] = {"chunk_s": chunks}
    name = ""
    async with session.get(events_url, headers={"Last-Event-ID": "0"}) as response:
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
                continue
            if not line.startswith("data: "):
                continue
            at = time.monotonic() - started
            data = json.loads(line.removeprefix("data: "))
            if name == "chunk":
                chunks[data.get("variant", "final")].append(at)
            elif name in MOMENTS:
                moments[f"{name}_s"] = at
            if name in ("done", "error"):
                moments["status"] = data.get("status", name)
                break
    return moments


async def one_run(
    session: aiohttp.ClientSession, url: str, pid: int, body: bytes, preview: str
) -> dict[str, Any]:
    """Upload the latents as one job with `preview` (or "none"), view it to its end."""
    cpu_before = cpu_seconds(pid)
    started = time.monotonic()
    async with session.post(f"{url}/v1/videos", params={"preview": preview}, data=body) as r:
        if r.status != 201:
            raise RuntimeError(f"POST /v1/videos?preview={preview}: HTTP {r.status}")
        job = await r.json()
    links = {"final": job["urls"]["content"]}
    if preview != "none":
        links["preview"] = job["urls"]["preview_content"]
    async with asyncio.TaskGroup() as group:
        events = group.create_task(event_moments(session, url + job["urls"]["events"], started))
        viewers = {
            variant: group.create_task(
                receive(session, "GET", url + link, started=started, keep_body=False)
            )
            for variant, link in links.items()
        }
    moments = events.result()
    seen: dict[str, Received] = {variant: task.result() for variant, task in viewers.items()}
    server_cpu_s = cpu_seconds(pid) - cpu_before
    if moments.get("status") != "completed" or any(v.status != 200 for v in seen.values()):
        raise RuntimeError(f"job {job['id']} ended {moments.get('status')}")
    async with session.get(f"{url}/v1/videos/{job['id']}") as r:
        final_job = await r.json()
    async with session.delete(f"{url}/v1/videos/{job['id']}") as r:
        if r.status != 200:
            raise RuntimeError(f"DELETE {job['id']}: HTTP {r.status}")
    record: dict[str, Any] = {"id": job["id"], "server_cpu_s": server_cpu_s, **moments}
    for variant, received in seen.items():
        if received.first_fragment_at is None:
            raise RuntimeError(f"job {job['id']}: no {variant} fragment reached the viewer")
        record[f"{variant}_ttff_s"] = received.first_fragment_at - started
        record[f"{variant}_last_byte_s"] = received.last_byte_at - started
        record[f"{variant}_bytes"] = received.size
    for variant, times in moments["chunk_s"].items():
        if times:  # the SSE cross-check of the viewers' first fragments
            record[f"{variant}_first_chunk_event_s"] = times[0]
    record["server"] = {"timings": final_job["timings"], "variants": final_job.get("variants")}
    if preview != "none":
        record["ready_after_preview_s"] = final_job["variants"]["final"]["ready_after_preview_s"]
        record["final_ready_after_preview_client_s"] = (
            moments["final_ready_s"] - record["preview_ttff_s"]
        )
        # The final alone, once its preview is done: slower than a job without a
        # preview would mean the two renditions still compete after the handover.
        record["final_after_preview_done_s"] = moments["done_s"] - moments["preview_done_s"]
        # An upload's final should decode only once its preview has: how many preview
        # chunks the client had been told of before the final's first.
        final_first = moments["chunk_s"]["final"][0]
        record["preview_chunks_before_final"] = sum(
            1 for at in moments["chunk_s"]["preview"] if at < final_first
        )
        record["preview_chunks"] = len(moments["chunk_s"]["preview"])
    return record


async def measure(
    url: str, pid: int, bodies: dict[str, bytes], repeats: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Warm-up runs, then `repeats` repeats of one pair per size: (runs, loads)."""
    runs: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []

    async def timed(body: bytes, arm: str) -> dict[str, Any]:
        return await asyncio.wait_for(one_run(session, url, pid, body, arm), RUN_TIMEOUT_S)

    async with client_session() as session:
        for body in bodies.values():
            for arm in ARMS * WARMUP_RUNS:
                await timed(body, arm)
        for repeat in range(repeats):
            before = load.sample([pid])
            for position, (size, body) in enumerate(bodies.items()):
                flip = (repeat + position) % 2
                for arm in ARMS[::-1] if flip else ARMS:
                    run = await timed(body, arm)
                    runs.append({"repeat": repeat, "size": size, "arm": arm, **run})
                    first = run.get("preview_ttff_s", run["final_ttff_s"])
                    _say(
                        f"repeat {repeat} {size} preview={arm:<6}: first fragment "
                        f"{first:.3f} s (final {run['final_ttff_s']:.3f} s), "
                        f"done {run['done_s']:.3f} s, CPU {run['server_cpu_s']:.2f} s"
                    )
            loads.append({"repeat": repeat, **load.between(before, load.sample([pid]))})
    return runs, loads


def judged(values: list[float], name: str) -> dict[str, Any]:
    """The spread of per-repeat values, and for a target its verdict."""
    spread = Spread.of(values)
    entry: dict[str, Any] = spread.as_dict() | {"per_repeat": values}
    if name in TARGETS:
        limit = TARGETS[name].limit
        entry["target"] = limit
        entry["median_meets"] = spread.median <= limit
        entry["verdict"] = verdict(spread, limit).value
    return entry


def summarize(runs: list[dict[str, Any]], sizes: Sequence[str]) -> dict[str, Any]:
    """Per size: each arm's medians, the paired ratios, and the preview job's
    final_ready after its preview."""
    grouped: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["size"], run["repeat"]), {})[run["arm"]] = run
    summary: dict[str, Any] = {}
    for size in sizes:
        pairs = [
            pair
            for (size_of, _), pair in sorted(grouped.items())
            if size_of == size and set(pair) == set(ARMS)
        ]
        medians: dict[str, dict[str, float]] = {}
        for arm in ARMS:
            keys = [k for k, v in pairs[0][arm].items() if isinstance(v, float)]
            medians[arm] = {k: statistics.median(p[arm][k] for p in pairs) for k in keys}
        ratios: dict[str, Any] = {}
        for name, ((arm_a, key_a), (arm_b, key_b), _) in RATIOS.items():
            ratios[name] = judged([p[arm_a][key_a] / p[arm_b][key_b] for p in pairs], name)
            ratios[name]["median_difference_s"] = statistics.median(
                p[arm_a][key_a] - p[arm_b][key_b] for p in pairs
            )
        ready = {key: judged([p[PREVIEW][key] for p in pairs], key) for key in READY_KEYS}
        early = sum(
            1
            for p in pairs
            if p[PREVIEW]["preview_chunks_before_final"] < p[PREVIEW]["preview_chunks"]
        )
        summary[size] = {
            "pairs": len(pairs),
            "final_first_chunk_before_preview_end": early,
            "medians_s": medians,
            "ratios": ratios,
        } | ready
    return summary


def _ratio_cell(entry: dict[str, Any]) -> str:
    return f"{entry['median']:.3f} ({entry['q1']:.3f}-{entry['q3']:.3f})"


def _size_rows(size: str, entry: dict[str, Any]) -> tuple[str, str, str]:
    """One size's row of the first-fragment table, of the cost table, and its
    cross-check line."""
    with_, without = entry["medians_s"][PREVIEW], entry["medians_s"]["none"]
    ratios = entry["ratios"]
    server, client = (entry[key] for key in READY_KEYS)
    first = (
        f"| {size} | {with_['preview_ttff_s']:.3f} s / {with_['final_ttff_s']:.3f} s | "
        f"{without['final_ttff_s']:.3f} s | {_ratio_cell(ratios['preview_first_fragment'])} | "
        f"{explain(ratios['preview_first_fragment'])} | "
        f"{_ratio_cell(ratios['final_first_fragment'])} |"
    )
    cost = (
        f"| {size} | {with_['done_s']:.3f} s / {without['done_s']:.3f} s | "
        f"{_ratio_cell(ratios['done'])} | {explain(ratios['done'])} | "
        f"{with_['server_cpu_s']:.2f} / {without['server_cpu_s']:.2f} "
        f"({_ratio_cell(ratios['server_cpu'])}) | "
        f"{server['median']:.3f} s ({server['q1']:.3f}-{server['q3']:.3f}) / "
        f"{client['median']:.3f} s |"
    )
    check = (
        f"- {size}: SSE first chunk preview {with_['preview_first_chunk_event_s']:.3f} s, "
        f"final {with_['final_first_chunk_event_s']:.3f} s (no preview: "
        f"{without['final_first_chunk_event_s']:.3f} s); `preview_done` at "
        f"{with_['preview_done_s']:.3f} s, then the final "
        f"{with_['final_after_preview_done_s']:.3f} s to `done` "
        f"(no preview: {without['done_s']:.3f} s). The final's first chunk came before "
        f"the preview's last in {entry['final_first_chunk_before_preview_end']} of "
        f"{entry['pairs']} jobs."
    )
    return first, cost, check


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    first_rows, cost_rows, checks = zip(
        *(_size_rows(size, entry) for size, entry in result["summary"].items()), strict=True
    )
    others = [entry["others_cores"] for entry in result["loads"]]
    lines = [
        f"Preview, then final (`--model tiny --device cpu --store none`, preview "
        f"`{PREVIEW}`): the same latents uploaded as a job with `preview={PREVIEW}` and "
        f"one with `preview=none`, {meta['repeats']} paired repeats, order alternating "
        f"({meta['finished_utc']}, {meta['wall_s']:.0f} s on {meta['cpus']} CPUs; load "
        f"average {meta['load_start']} at start). Seconds are medians from before the "
        "POST to the client's viewer holding the first fragment (ftyp + moov + first "
        "moof/mdat), or to the `done` event; a ratio is the median of the paired ratios "
        "with their IQR.",
        "",
        "| size (frames x W x H) | with preview: preview / final first fragment | "
        "no preview: first fragment | preview / no-preview first fragment (target <= "
        f"{TARGETS['preview_first_fragment'].limit}) | verdict | final with / without |",
        "|---|---|---|---|---|---|",
        *first_rows,
        "",
        "| size | `done`: with / without preview | ratio (target <= "
        f"{TARGETS['done'].limit}) | verdict | server CPU s per job: with / without "
        "(ratio) | final_ready after the preview's first fragment: server / client |",
        "|---|---|---|---|---|---|",
        *cost_rows,
        "",
        "Cross-checks (medians): the first `chunk` event of each variant at the client "
        "(SSE) against the viewers' first fragments, and the with-preview job's time "
        "from `preview_done` to `done` (its final, once the preview is done) against "
        "the no-preview job's `done`:",
        "",
        *checks,
        "",
        "What they mean: the preview's first fragment against the first fragment a "
        "viewer gets without a preview is what the preview buys; the final's first "
        "fragment with a preview against without is what it delays the final by (an "
        "upload's final should decode once its preview has; see the cross-checks for how "
        "often it does); `done` and the server's CPU "
        "time with against without are what the preview costs on top of the final "
        "alone. `final_ready` is sent once the final has passed a viewer of the preview "
        "(server: the job's `variants.final.ready_after_preview_s`; client: the "
        "`final_ready` event's arrival minus the preview viewer's first fragment).",
        "",
        f"Other processes kept {statistics.median(others):.2f} cores busy per repeat "
        f"(median; {max(others):.2f} at most).",
    ]
    return "\n".join(lines) + "\n"


def _say(text: str) -> None:
    print(f"[preview] {text}", flush=True)


def _repeats(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more (5 or more for a verdict)")
    return value


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.preview", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--repeats", type=_repeats, default=20, help="paired repeats")
    parser.add_argument(
        "--size",
        dest="sizes",
        action="append",
        metavar="FRAMESxWIDTHxHEIGHT",
        help=f"latents to decode (repeatable; default {' '.join(DEFAULT_SIZES)})",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the results go")
    args = parser.parse_args(argv)
    sizes = args.sizes or list(DEFAULT_SIZES)
    started = time.monotonic()
    meta: dict[str, Any] = {
        "preview": PREVIEW,
        "commit": _commit(),
        "server": "vaecast serve --host 127.0.0.1 --port 0 --model tiny --device cpu --store none",
        "first_fragment_from": "viewers of /content?variant=preview and /content (client)",
        "done_from": "the /events `done` event's arrival at the client",
        "started_utc": now_utc(),
        "repeats": args.repeats,
        "sizes": sizes,
        "fps": FPS,
        "cpus": os.cpu_count(),
        "load_start": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }
    cache = args.out / "tmp"
    bodies = {size: latents_body(make_latents(*parse_size(size), cache), FPS) for size in sizes}
    with serve("preview", None, cache) as (url, process):
        warm_up = asyncio.run(warm_up_ended(url))
        _say(f"{url}; demo warm-up {warm_up['state']}")
        runs, loads = asyncio.run(measure(url, process.pid, bodies, args.repeats))
    meta["finished_utc"] = now_utc()
    meta["wall_s"] = time.monotonic() - started
    result = {"meta": meta, "summary": summarize(runs, sizes), "loads": loads, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "preview.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (args.out / "preview.md").write_text(text)
    print(text)
    for size, entry in result["summary"].items():
        for name in TARGETS:
            _say(f"{size} {TARGETS[name].title}: {explain(entry['ratios'][name])}")
    return result


if __name__ == "__main__":
    main()
