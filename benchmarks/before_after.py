"""One change, measured end to end: the vaecast arm of several server trees, interleaved.

    python -m benchmarks.before_after --config before=/tmp/before:rgb \\
        --config after=.:rgb --config after-yuv420=.:yuv420 [--frames 81 ...]

Each `--config LABEL=TREE:HOST_FRAMES` starts `python -m benchmarks.server` from the
checkout TREE with that host-frame format; all run at once (idle ones only hold
memory) and the requests alternate between them, the order rotated every repeat,
so machine load drifts over all of them alike. Per configuration: the vaecast arm
(TTFF, last byte) and the decode-thread / encode-thread references. Writes
`before_after.json` and `before_after.md` to the output directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.arms import arm_url, now_utc
from benchmarks.client import (
    ServerProcess,
    client_session,
    count_frames,
    latents_body,
    make_latents,
    receive,
    server_process,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
MEASURES = ("vaecast", "decode_only", "encode_only")


def _config(text: str) -> tuple[str, Path, str]:
    label, _, rest = text.partition("=")
    tree, _, host_frames = rest.rpartition(":")
    if not label or not tree or host_frames not in ("rgb", "yuv420"):
        raise argparse.ArgumentTypeError(f"expected LABEL=TREE:rgb|yuv420, got {text!r}")
    return label, Path(tree).resolve(), host_frames


async def _measure(
    servers: dict[str, ServerProcess], body: bytes, frames: int, fps: int, repeats: int
) -> list[dict[str, Any]]:
    runs = []
    labels = list(servers)
    async with client_session() as session:
        for label in labels:  # warm-up, not measured
            await receive(session, "POST", arm_url(servers[label], "vaecast", fps), body)
        for repeat in range(repeats):
            shift = repeat % len(labels)
            for label in labels[shift:] + labels[:shift]:
                for measure in MEASURES:
                    url = arm_url(servers[label], measure, fps)
                    received = await receive(session, "POST", url, body)
                    record: dict[str, Any] = {
                        "config": label,
                        "measure": measure,
                        "repeat": repeat,
                        "load_1min": os.getloadavg()[0],
                    }
                    if measure == "vaecast":
                        record |= received.relative()
                        record["frames_ok"] = count_frames(received.body) == frames
                    else:
                        record["result"] = json.loads(received.body)
                    runs.append(record)
    return runs


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary = {}
    for label in dict.fromkeys(r["config"] for r in runs):
        mine = [r for r in runs if r["config"] == label]
        arm = [r for r in mine if r["measure"] == "vaecast"]
        decode = [r["result"] for r in mine if r["measure"] == "decode_only"]
        encode = [r["result"] for r in mine if r["measure"] == "encode_only"]
        summary[label] = {
            "ttff_s": statistics.median(r["ttff_s"] for r in arm),
            "last_byte_s": statistics.median(r["last_byte_s"] for r in arm),
            "smooth_start_s": statistics.median(r["smooth_start_s"] for r in arm),
            "decode_thread_s": statistics.median(d["total_s"] for d in decode),
            "quantize_s": statistics.median(d["quantize_s"] for d in decode),
            "encode_thread_s": statistics.median(e["total_s"] for e in encode),
            "frames_ok": all(r["frames_ok"] for r in arm),
            "runs": len(arm),
        }
    return summary


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    first = next(iter(result["summary"].values()))
    lines = [
        f"# Before / after ({meta['finished_utc']})",
        "",
        f"vaecast arm over HTTP, {meta['frames']} frames at {meta['width']}x{meta['height']}, "
        f"model `{meta['model']}`, {meta['repeats']} interleaved repeats (medians); load "
        f"average {meta['load_start']} at start, {meta['load_end']} at end.",
        "",
        "| config | TTFF s | last byte s | decode thread s (quantize s) | encode thread s "
        "| last byte vs first row | frames ok |",
        "|---|---:|---:|---:|---:|---:|:-:|",
    ]
    for label, s in result["summary"].items():
        lines.append(
            f"| {label} ({meta['configs'][label]}) | {s['ttff_s']:.3f} | {s['last_byte_s']:.2f} "
            f"| {s['decode_thread_s']:.2f} ({s['quantize_s']:.2f}) | {s['encode_thread_s']:.2f} "
            f"| {s['last_byte_s'] / first['last_byte_s']:.2f}x "
            f"| {'yes' if s['frames_ok'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=_config, action="append", required=True)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    load = lambda: " ".join(f"{v:.2f}" for v in os.getloadavg())  # noqa: E731
    meta: dict[str, Any] = {
        "started_utc": now_utc(),
        "load_start": load(),
        **{k: getattr(args, k) for k in ("frames", "width", "height", "fps", "model", "repeats")},
        "configs": {label: f"{tree}, {frames}" for label, tree, frames in args.config},
    }
    work_dir = args.out / "tmp"
    body = latents_body(make_latents(args.frames, args.width, args.height, work_dir), args.fps)
    with contextlib.ExitStack() as stack:
        servers = {
            label: stack.enter_context(
                server_process(
                    args.model, args.device, work_dir / f"server-{label}.log", frames, tree
                )
            )
            for label, tree, frames in args.config
        }
        runs = asyncio.run(_measure(servers, body, args.frames, args.fps, args.repeats))
    meta |= {"load_end": load(), "finished_utc": now_utc()}
    result = {"meta": meta, "summary": summarize(runs), "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "before_after.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "before_after.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
