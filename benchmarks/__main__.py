"""`python -m benchmarks`: vaecast against the alternatives, on the same latents, one run.

    python -m benchmarks [--frames 81] [--width 832] [--height 480] [--model tiny]
                         [--repeats 5] [--rounds 5] [--out benchmarks/results]
                         [--sections ...]

Sections (all by default): `arms` (time to first byte / first playable fragment /
last byte of four pipelines over HTTP; vaecast run back to back with each other arm
and reference, the ratios paired and judged against the targets, see `paired`),
`fanout` (1, 10, 100, 1000 viewers of one job), `profile` (py-spy over the server, if
installed), `memory` (peak server RSS against length, fresh process per length),
`throughput` (encoder path vs ffmpeg CLI).
Writes `benchmarks.json`, `benchmarks.md` and `timeline.png` to the output directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import av
import torch

from benchmarks import arms, fanout, memory, paired, profiling, report, throughput
from benchmarks.client import latents_body, make_latents, server_process, tiny_weights_digest
from benchmarks.pipelines import HOST_FORMATS, bridge_host_format
from benchmarks.server import load_decoder
from vaecast.codecs.h264 import EncoderSettings

SECTIONS = ("arms", "fanout", "profile", "memory", "throughput")
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def _sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        width, height = part.lower().split("x")
        sizes.append((int(width), int(height)))
    return sizes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=81, help="1 + 4k (default 81)")
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--fps", type=int, default=16)
    p.add_argument("--model", default="tiny")
    p.add_argument(
        "--weights",
        type=Path,
        default=None,
        help="the model's weights file or folder (benchmarks/device.sh: random weights)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--host-frames",
        choices=sorted(HOST_FORMATS),
        default=bridge_host_format(),
        help="what the decode thread hands the encoder in every arm: uint8 RGB, or YUV "
        "4:2:0 converted in torch (default: what vaecast's pipeline does)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=paired.MIN_REPEATS,
        help=f"repeats (>= 1; {paired.MIN_REPEATS} or more for a verdict)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=paired.ROUNDS,
        help="rounds of pairs per repeat, their ratios averaged (default %(default)s)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    p.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}"
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the other sections of an existing benchmarks.json in --out",
    )
    p.add_argument("--no-warmup", action="store_true", help="skip the unmeasured first runs")
    p.add_argument("--fanout", type=_ints, default=[1, 10, 100, 1000], help="viewer counts")
    p.add_argument(
        "--fanout-repeats", type=int, default=3, help="rounds of the fan-out jobs (median)"
    )
    p.add_argument("--memory-frames", type=_ints, default=[81, 321, 1281])
    p.add_argument(
        "--memory-baseline-frames",
        type=_ints,
        default=[81, 321],
        help="lengths for decode_then_encode (it holds the whole video: keep these short)",
    )
    p.add_argument(
        "--memory-size", type=_sizes, default=None, help="WxH (default: --width/--height)"
    )
    p.add_argument("--throughput-sizes", type=_sizes, default=_sizes("832x480,1280x720"))
    p.add_argument("--throughput-frames", type=int, default=81)
    p.add_argument("--profile-requests", type=int, default=2)
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser().error(f"unknown sections {sorted(unknown)}")
    if min(args.repeats, args.rounds, args.fanout_repeats) < 1:
        parser().error("--repeats, --rounds and --fanout-repeats must be >= 1")
    out: Path = args.out
    work_dir = out / "tmp"
    settings = EncoderSettings()
    result: dict[str, Any] = {"meta": _meta(args, settings)}
    previous = out / "benchmarks.json"
    if args.merge and previous.exists():
        kept = json.loads(previous.read_text())
        for section in ("arms", "fanout", "profile", "memory", "throughput"):
            if section not in sections and section in kept:
                result[section] = kept[section]
        result["meta"]["merged_from"] = kept["meta"]
    _say(f"latents: {args.frames} frames at {args.width}x{args.height}")
    latents = make_latents(args.frames, args.width, args.height, work_dir)
    body = latents_body(latents, args.fps)
    plan = load_decoder(args.model, "cpu", args.weights).plan(latents.shape)

    if {"arms", "fanout", "profile"} & set(sections):
        log = work_dir / "server.log"
        with server_process(
            args.model, args.device, log, args.host_frames, weights=args.weights
        ) as server:
            if "arms" in sections:
                _say(
                    f"arms: {args.repeats} repeats of {args.rounds} x "
                    f"{len(paired.schedule(0))} runs, vaecast paired with each other arm"
                )
                runs, loads = asyncio.run(
                    arms.run_arms(
                        server,
                        body,
                        plan.frames,
                        args.fps,
                        args.repeats,
                        not args.no_warmup,
                        args.rounds,
                    )
                )
                timelines = [arms.timeline(runs, arm) for arm in ("vaecast", "decode_then_encode")]
                result["arms"] = {
                    "summary": arms.summarize(runs, loads),
                    "timelines": timelines,
                    "runs": runs,
                }
                report.timeline_png(
                    timelines,
                    out / "timeline.png",
                    f"{args.model}, {plan.frames} frames at {plan.width}x{plan.height}, "
                    f"{plan.chunks} chunks (the median run)",
                )
            if "fanout" in sections:
                _say(f"fan-out: {args.fanout} viewers")
                runs = asyncio.run(
                    fanout.run_fanout(
                        server, body, plan.frames, args.fps, args.fanout, args.fanout_repeats
                    )
                )
                result["fanout"] = {"runs": runs, "repeats": args.fanout_repeats}
            if "profile" in sections:
                if profiling.available():
                    _say("profile: py-spy on the server")
                    result["profile"] = profiling.profile_server(
                        server, body, args.fps, args.profile_requests, out / "profile.txt"
                    )
                else:
                    result["profile_skipped"] = "py-spy is not installed"

    if "memory" in sections:
        width, height = (args.memory_size or [(args.width, args.height)])[0]
        lengths = {"vaecast": args.memory_frames, "decode_then_encode": args.memory_baseline_frames}
        _say(f"memory: {lengths} at {width}x{height}")
        runs = memory.run_memory(
            {arm: frames for arm, frames in lengths.items() if frames},
            width,
            height,
            args.fps,
            args.model,
            args.device,
            work_dir,
            args.host_frames,
        )
        result["memory"] = {"runs": runs, "per_100_frames": memory.slopes(runs)}

    if "throughput" in sections:
        _say(f"throughput: {args.throughput_sizes}")
        result["throughput"] = {
            "runs": throughput.run_throughput(
                args.throughput_sizes, args.throughput_frames, args.fps, args.repeats, settings
            )
        }

    for section in sections:  # sections kept by --merge keep their own time
        if section in result:
            result[section]["measured_utc"] = arms.now_utc()
    result["meta"]["load_end"] = _load()
    result["meta"]["finished_utc"] = arms.now_utc()
    report.write_json(result, out / "benchmarks.json")
    (out / "benchmarks.md").write_text(report.markdown(result))
    _say(f"wrote {out / 'benchmarks.json'}, {out / 'benchmarks.md'}")
    return result


def _meta(args: argparse.Namespace, settings: EncoderSettings) -> dict[str, Any]:
    return {
        "started_utc": arms.now_utc(),
        "frames": args.frames,
        "width": args.width,
        "height": args.height,
        "fps": args.fps,
        "model": args.model,
        "device": args.device,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "host_frames": args.host_frames,
        "encoder": f"{settings.preset} {' '.join(map(str, settings.rate_control))} zerolatency, "
        f"keyframe every {settings.keyframe_interval_s:g} s",
        "machine": _machine(),
        "load_start": _load(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "pyav": av.__version__,
        "ffmpeg_cli": _ffmpeg_version(),
        "weights_sha256": _weights_digest(args.model),
    }


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} CPUs ({model}), {memory_gb:.0f} GiB RAM, {platform.system()}"


def _weights_digest(model: str) -> str | None:
    """The shipped weights' digest (first 16 hex), so a table names the model it measured."""
    return tiny_weights_digest() if model == "tiny" else None


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def _ffmpeg_version() -> str:
    try:
        first = subprocess.run(
            ["/usr/bin/ffmpeg", "-version"], capture_output=True, text=True, check=True
        ).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unavailable"
    return first.split(" Copyright")[0]


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    main()
