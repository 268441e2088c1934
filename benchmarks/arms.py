"""The side-by-side: four ways to serve the same latents, timed at the HTTP client.

Arms (each one request, the latents as a raw safetensors body):
- `vaecast`: `POST /v1/videos/stream`, the progressive fMP4 of the production app;
- `decode_then_encode`: full decode, then encode, then one complete MP4;
- `preencode`: encode overlapping decode (vLLM-Omni `preencode_mp4`), sent at the end;
- `ffmpeg_pipe`: raw frames piped into the ffmpeg CLI, its fMP4 stdout streamed;
and two references, each stage alone on the same latents: `decode_only` (decode +
quantize + host copy: the decode thread's work) and `encode_only` (x264 + boxes: the
encode thread's work). Each repeat runs vaecast back to back with each of the
others (`paired.schedule`), and records the machine's load while it ran
(`load`): the ratios are computed within those pairs (`paired`).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from benchmarks import load, paired
from benchmarks.client import ServerProcess, client_session, count_frames, receive
from benchmarks.paired import PEER_ARMS, REFERENCES

ARMS = ("vaecast", *PEER_ARMS)
SCHEDULE = ARMS + REFERENCES


def arm_url(server: ServerProcess, arm: str, fps: int) -> str:
    if arm == "vaecast":
        return f"{server.url}/v1/videos/stream?fps={fps}"
    return f"{server.url}/bench/{arm}?fps={fps}"


async def warm_up(session: Any, server: ServerProcess, body: bytes, fps: int) -> None:
    """First-call allocations, kernel selection, page cache: not measured."""
    for arm in ("vaecast", "ffmpeg_pipe"):
        await receive(session, "POST", arm_url(server, arm, fps), body, keep_body=False)


async def run_arms(
    server: ServerProcess,
    body: bytes,
    planned_frames: int,
    fps: int,
    repeats: int,
    warmup: bool,
    rounds: int = 1,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`repeats` repeats of `paired.repeat_schedule`: one record per run, one per repeat."""
    runs: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    async with client_session() as session:
        if warmup:
            await warm_up(session, server, body, fps)
        for repeat in range(repeats):
            repeat_runs, repeat_load = await run_repeat(
                session, server, body, planned_frames, fps, repeat, rounds
            )
            runs += repeat_runs
            loads.append(repeat_load)
    return runs, loads


async def run_repeat(
    session: Any,
    server: ServerProcess,
    body: bytes,
    planned_frames: int,
    fps: int,
    repeat: int,
    rounds: int = 1,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One repeat: `rounds` rounds of vaecast back to back with each other arm and
    reference, and the machine's load over the whole repeat."""
    runs: list[dict[str, Any]] = []
    repeat_start = load.sample([server.pid])
    for position, (round_, arm, pair) in enumerate(paired.repeat_schedule(repeat, rounds)):
        await take_trace(session, server)
        before = load.sample([server.pid])
        received = await receive(session, "POST", arm_url(server, arm, fps), body)
        run_load = load.between(before, load.sample([server.pid]))
        trace = await take_trace(session, server)
        if received.status != 200:
            raise RuntimeError(f"{arm}: HTTP {received.status}: {received.body[:300]!r}")
        record: dict[str, Any] = {
            "arm": arm,
            "pair": pair,
            "repeat": repeat,
            "round": round_,
            "position": position,
            "others_cores": run_load["others_cores"],
            "load_1min": run_load["loadavg_1min"][0],
        }
        if arm in REFERENCES:
            record["result"] = json.loads(received.body)
        else:
            record |= received.relative()
            record["frames_decoded"] = count_frames(received.body)
            record["frames_planned"] = planned_frames
            record["trace"] = [{**event, "t": event["t"] - received.started} for event in trace]
        runs.append(record)
    repeat_load = load.between(repeat_start, load.sample([server.pid]))
    repeat_load["repeat"] = repeat
    repeat_load["loaded"] = repeat_load["others_cores"] > paired.LOADED_CORES
    return runs, repeat_load


async def take_trace(session: Any, server: ServerProcess) -> list[dict[str, Any]]:
    async with session.get(f"{server.url}/bench/trace") as response:
        return list(await response.json())


def _median(values: list[float]) -> float:
    return statistics.median(values)


def summarize(runs: list[dict[str, Any]], loads: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per arm, the references, and the paired ratios with their verdicts."""
    decode = [r["result"] for r in runs if r["arm"] == "decode_only"]
    encode = [r["result"] for r in runs if r["arm"] == "encode_only"]
    decode_s = _median([d["total_s"] for d in decode])
    encode_s = _median([e["total_s"] for e in encode])
    first_chunk_s = _median([d["chunk_s"][0] for d in decode]) + _median(
        [e["chunk_s"][0] for e in encode]
    )
    references = {
        "decode_only_s": decode_s,
        "decode_only_model_s": _median([d["model_s"] for d in decode]),
        "decode_only_quantize_s": _median([d["quantize_s"] for d in decode]),
        "encode_only_s": encode_s,
        "encode_only_open_s": _median([e["open_s"] for e in encode]),
        "first_chunk_decode_plus_encode_s": first_chunk_s,
        "serial_decode_plus_encode_s": decode_s + encode_s,
        "pipeline_bound_s": max(decode_s, encode_s),
    }
    ratios = paired.per_repeat(runs)
    ratio_summary = paired.summarize(ratios)
    arms: dict[str, Any] = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        stats = {}
        for key in ("ttfb_s", "ttff_s", "smooth_start_s", "last_byte_s"):
            values = [r[key] for r in mine]
            stats[key] = {"median": _median(values), "min": min(values), "max": max(values)}
        arms[arm] = {
            **stats,
            "runs": len(mine),
            "bytes": _median([r["bytes"] for r in mine]),
            "frames_ok": all(r["frames_decoded"] == r["frames_planned"] for r in mine),
            # Unpaired (medians over all repeats): the paired ratios are below.
            "ttff_over_first_chunk": stats["ttff_s"]["median"] / first_chunk_s,
            "total_over_bound": stats["last_byte_s"]["median"] / references["pipeline_bound_s"],
        }
    for arm, stats in arms.items():
        # Each arm against vaecast within their pairs (the inverse of vaecast's ratios).
        if arm == "vaecast":
            stats["ttff_vs_vaecast"] = stats["total_vs_vaecast"] = 1.0
            continue
        stats["ttff_vs_vaecast"] = _median([1 / r[f"ttff_over_{arm}"] for r in ratios])
        stats["total_vs_vaecast"] = _median([1 / r[f"total_over_{arm}"] for r in ratios])
    for key in ("ttff_over_first_chunk", "total_over_bound"):
        arms["vaecast"][key] = ratio_summary[key]["median"]  # paired
    loaded = sum(1 for repeat in loads if repeat["loaded"])
    return {
        "references": references,
        "arms": arms,
        "stages": {
            arm: stage_medians(runs, arm) for arm in ("vaecast", "preencode", "ffmpeg_pipe")
        },
        "paired": {
            "per_repeat": ratios,
            "summary": ratio_summary,
            "load": loads,
            "loaded_repeats": loaded,
            "loaded_cores": paired.LOADED_CORES,
        },
    }


# Where vaecast's time to the first fragment goes: (name, from event, to event), each
# event the first of its name in the run's trace (chunk 0 for per-chunk events), in
# seconds since the client sent the request ("sent" is 0, "received" its TTFF).
# The encoder's open appears only when the job opened its own: a job like the one
# before it gets the spare its server opened between jobs (vaecast.pipeline.encoder_spares).
TTFF_STAGES = (
    ("request head parsed", "sent", "request"),
    ("body read, parsed, job started", "request", "open_start"),
    ("encoder open (no spare)", "open_start", "opened"),
    ("request to decode start", "request", "decode_start"),
    ("first chunk decode", "decode_start", "decoded"),
    ("quantize + hand-off to the encode thread", "decoded", "encode_start"),
    ("first chunk encode", "encode_start", "encoded"),
    ("to the client", "encoded", "received"),
)


def ttff_stages(run: dict[str, Any]) -> dict[str, float]:
    """`TTFF_STAGES` of one vaecast run (those whose events its server recorded)."""
    moments: dict[str, float] = {"sent": 0.0, "received": run["ttff_s"]}
    for event in run["trace"]:
        # Only what happened between the request and its first fragment: a spare
        # encoder opens after a job (before the next one's request, or after this
        # one's first fragment when the trace is taken late).
        if event["chunk"] in (None, 0) and 0 <= event["t"] <= run["ttff_s"]:
            moments.setdefault(event["event"], event["t"])
    return {
        name: moments[end] - moments[start]
        for name, start, end in TTFF_STAGES
        if start in moments and end in moments
    }


def total_stages(run: dict[str, Any]) -> dict[str, float]:
    """Where a run's total goes: before the decode, the decode (with everything that
    ran beside it), and after the last chunk was decoded. Also what the decode thread
    spent handing chunks off (quantize + the put, waiting while the queue is full)."""
    first: dict[str, float] = {}
    decoded: dict[int, float] = {}
    handed: dict[int, float] = {}
    for event in run["trace"]:
        first.setdefault(event["event"], event["t"])
        if event["event"] == "decoded":
            decoded[event["chunk"]] = event["t"]
        elif event["event"] in ("handed_off", "piped"):
            handed[event["chunk"]] = event["t"]
    if "decode_start" not in first or not decoded:
        return {}
    last = decoded[max(decoded)]
    return {
        "before the decode": first["decode_start"],
        "decode (last chunk decoded)": last - first["decode_start"],
        "hand-offs in the decode thread": sum(
            handed[i] - decoded[i] for i in decoded if i in handed
        ),
        "after the last chunk decoded": run["last_byte_s"] - last,
    }


def stage_medians(runs: list[dict[str, Any]], arm: str) -> dict[str, dict[str, float]]:
    """Medians over `arm`'s runs of `ttff_stages` (vaecast only) and `total_stages`."""
    mine = [r for r in runs if r["arm"] == arm]
    result: dict[str, dict[str, float]] = {}
    for key, stages in (("ttff", ttff_stages), ("total", total_stages)):
        if key == "ttff" and arm != "vaecast":
            continue
        per_run = [stages(r) for r in mine]
        names = dict.fromkeys(name for stage in per_run for name in stage)
        result[key] = {
            name: _median([stage[name] for stage in per_run if name in stage]) for name in names
        }
    return result


def timeline(runs: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    """Per chunk of the median-total run of `arm`: decoded, encoded, received (s)."""
    mine = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["last_byte_s"])
    run = mine[len(mine) // 2]
    per_event: dict[str, dict[int, float]] = {}
    for event in run["trace"]:
        if event["chunk"] is not None:
            per_event.setdefault(event["event"], {})[event["chunk"]] = event["t"]
    chunks = sorted(per_event.get("decoded", {}))
    return {
        "arm": arm,
        "repeat": run["repeat"],
        "decoded_s": [per_event["decoded"][i] for i in chunks],
        "encoded_s": [per_event.get("encoded", {}).get(i) for i in chunks],
        "received_s": run["fragment_s"],
        "ttff_s": run["ttff_s"],
        "last_byte_s": run["last_byte_s"],
    }


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
