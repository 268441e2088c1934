"""The side-by-side: four ways to serve the same latents, timed at the HTTP client.

Arms (each one request, the latents as a raw safetensors body):
- `vaecast`: `POST /v1/videos/stream`, the progressive fMP4 of the production app;
- `decode_then_encode`: full decode, then encode, then one complete MP4;
- `preencode`: encode overlapping decode (vLLM-Omni `preencode_mp4`), sent at the end;
- `ffmpeg_pipe`: raw frames piped into the ffmpeg CLI, its fMP4 stdout streamed;
and two references, each stage alone on the same latents: `decode_only` (decode +
quantize + host copy: the decode thread's work) and `encode_only` (x264 + boxes: the
encode thread's work). Runs are interleaved, the order rotated every repeat.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

from benchmarks.client import ServerProcess, client_session, count_frames, receive

ARMS = ("vaecast", "decode_then_encode", "preencode", "ffmpeg_pipe")
REFERENCES = ("decode_only", "encode_only")
SCHEDULE = ARMS + REFERENCES


def arm_url(server: ServerProcess, arm: str, fps: int) -> str:
    if arm == "vaecast":
        return f"{server.url}/v1/videos/stream?fps={fps}"
    return f"{server.url}/bench/{arm}?fps={fps}"


async def run_arms(
    server: ServerProcess, body: bytes, planned_frames: int, fps: int, repeats: int, warmup: bool
) -> list[dict[str, Any]]:
    """Every arm and reference `repeats` times, interleaved; one record per run."""
    runs: list[dict[str, Any]] = []
    async with client_session() as session:
        if warmup:  # first-call allocations, kernel selection, page cache: not measured
            for arm in ("vaecast", "ffmpeg_pipe"):
                await receive(session, "POST", arm_url(server, arm, fps), body, keep_body=False)
        for repeat in range(repeats):
            shift = repeat % len(SCHEDULE)
            for position, arm in enumerate(SCHEDULE[shift:] + SCHEDULE[:shift]):
                await _take_trace(session, server)
                load = os.getloadavg()[0]
                received = await receive(session, "POST", arm_url(server, arm, fps), body)
                trace = await _take_trace(session, server)
                if received.status != 200:
                    raise RuntimeError(f"{arm}: HTTP {received.status}: {received.body[:300]!r}")
                record: dict[str, Any] = {
                    "arm": arm,
                    "repeat": repeat,
                    "position": position,
                    "load_1min": load,
                }
                if arm in REFERENCES:
                    record["result"] = json.loads(received.body)
                else:
                    record |= received.relative()
                    record["frames_decoded"] = count_frames(received.body)
                    record["frames_planned"] = planned_frames
                    record["trace"] = [
                        {**event, "t": event["t"] - received.started} for event in trace
                    ]
                runs.append(record)
    return runs


async def _take_trace(session: Any, server: ServerProcess) -> list[dict[str, Any]]:
    async with session.get(f"{server.url}/bench/trace") as response:
        return list(await response.json())


def _median(values: list[float]) -> float:
    return statistics.median(values)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per arm, the references, and the ratios the issue asks for."""
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
            "ttff_over_first_chunk": stats["ttff_s"]["median"] / first_chunk_s,
            "total_over_bound": stats["last_byte_s"]["median"] / references["pipeline_bound_s"],
        }
    base = arms["vaecast"]
    for stats in arms.values():
        stats["ttff_vs_vaecast"] = stats["ttff_s"]["median"] / base["ttff_s"]["median"]
        stats["total_vs_vaecast"] = stats["last_byte_s"]["median"] / base["last_byte_s"]["median"]
    return {"references": references, "arms": arms}


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
