"""One change, measured end to end: every arm on several server trees, in one run.

    python -m benchmarks.before_after --config before=/tmp/before:yuv420 \\
        --config after=.:yuv420 [--repeats 5] [--frames 81 ...]

Each `--config LABEL=TREE:HOST_FRAMES` starts `python -m benchmarks.server` from the
checkout TREE with that host-frame format; all run at once (idle ones only hold
memory). A repeat runs one paired repeat of the arms (`arms.run_repeat`: vaecast back
to back with each other arm and reference) on each server in turn, the servers'
order rotated every repeat, so the machine's load drifts over all of them alike.
Per configuration: the arms' medians, vaecast's paired ratios and their verdicts
against the targets; between configurations, vaecast's own TTFF and total per
repeat over the first configuration's. Writes `before_after.json` and
`before_after.md` to the output directory.
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

from benchmarks import arms, paired
from benchmarks.arms import now_utc
from benchmarks.client import (
    ServerProcess,
    client_session,
    latents_body,
    make_latents,
    server_process,
)
from benchmarks.report import ARM_TITLES

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def _config(text: str) -> tuple[str, Path, str]:
    label, _, rest = text.partition("=")
    tree, _, host_frames = rest.rpartition(":")
    if not label or not tree or host_frames not in ("rgb", "yuv420"):
        raise argparse.ArgumentTypeError(f"expected LABEL=TREE:rgb|yuv420, got {text!r}")
    return label, Path(tree).resolve(), host_frames


async def _measure(
    servers: dict[str, ServerProcess], body: bytes, frames: int, fps: int, repeats: int
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in servers}
    loads: dict[str, list[dict[str, Any]]] = {label: [] for label in servers}
    labels = list(servers)
    async with client_session() as session:
        for label in labels:
            await arms.warm_up(session, servers[label], body, fps)
        for repeat in range(repeats):
            shift = repeat % len(labels)
            for label in labels[shift:] + labels[:shift]:
                repeat_runs, repeat_load = await arms.run_repeat(
                    session, servers[label], body, frames, fps, repeat
                )
                runs[label] += repeat_runs
                loads[label].append(repeat_load)
    return runs, loads


def vaecast_against_first(
    runs: dict[str, list[dict[str, Any]]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per configuration, per repeat: the median of its vaecast runs' TTFF and total
    over the first configuration's in the same repeat; their spread over the repeats."""
    first = next(iter(runs))

    def per_repeat(label: str, key: str) -> dict[int, float]:
        by_repeat: dict[int, list[float]] = {}
        for run in runs[label]:
            if run["arm"] == paired.VAECAST:
                by_repeat.setdefault(run["repeat"], []).append(run[key])
        return {repeat: statistics.median(values) for repeat, values in by_repeat.items()}

    result: dict[str, dict[str, dict[str, Any]]] = {}
    for label in runs:
        result[label] = {}
        for key in ("ttff_s", "last_byte_s"):
            base, mine = per_repeat(first, key), per_repeat(label, key)
            ratios = [mine[r] / base[r] for r in sorted(mine) if r in base]
            result[label][key] = paired.Spread.of(ratios).as_dict()
    return result


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"# Before / after ({meta['finished_utc']})",
        "",
        f"Every arm over HTTP, {meta['frames']} frames at {meta['width']}x{meta['height']}, "
        f"model `{meta['model']}`, {meta['repeats']} repeats; in each repeat, one paired "
        "repeat of the arms on each configuration's server in turn (the order rotated). "
        f"Load average {meta['load_start']} at start, {meta['load_end']} at end.",
        "",
        "| config | vaecast TTFF s | vaecast last byte s "
        + "".join(f"| {paired.TARGETS[name].title} " for name in paired.TARGETS)
        + "| vaecast TTFF vs first row | vaecast total vs first row | loaded repeats "
        "| frames ok |",
        "|---|---:|---:|" + "---|" * len(paired.TARGETS) + "---:|---:|---:|:-:|",
    ]
    for label, config in result["configs"].items():
        summary = config["summary"]
        vaecast = summary["arms"]["vaecast"]
        versus = result["vaecast_vs_first"][label]
        targets = "".join(
            f"| {summary['paired']['summary'][name]['median']:.3f} "
            f"({paired.explain(summary['paired']['summary'][name]).split(':')[0]}) "
            for name in paired.TARGETS
        )
        frames_ok = all(stats["frames_ok"] for stats in summary["arms"].values())
        lines.append(
            f"| {label} ({meta['configs'][label]}) | {vaecast['ttff_s']['median']:.3f} "
            f"| {vaecast['last_byte_s']['median']:.2f} {targets}"
            f"| {_spread(versus['ttff_s'])} | {_spread(versus['last_byte_s'])} "
            f"| {summary['paired']['loaded_repeats']}/{meta['repeats']} "
            f"| {'yes' if frames_ok else 'NO'} |"
        )
    lines += [
        "",
        "Targets: the median of vaecast's paired ratio and its verdict (met / not met / "
        "inconclusive when the IQR straddles the target; see `benchmarks/paired.py`). "
        "Against the first row: the median over repeats of (this configuration's vaecast "
        "run / the first configuration's, same repeat), with its min-max.",
        "",
        "Totals per arm (medians, s):",
        "",
        "| config | " + " | ".join(ARM_TITLES[arm] for arm in arms.ARMS) + " |",
        "|---|" + "---:|" * len(arms.ARMS),
    ]
    for label, config in result["configs"].items():
        stats = config["summary"]["arms"]
        cells = " | ".join(f"{stats[arm]['last_byte_s']['median']:.2f}" for arm in arms.ARMS)
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines) + "\n"


def _spread(entry: dict[str, Any]) -> str:
    return f"{entry['median']:.3f} ({entry['low']:.2f}-{entry['high']:.2f})"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=_config, action="append", required=True)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--fps", type=int, default=16)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=paired.MIN_REPEATS)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    loadavg = lambda: " ".join(f"{v:.2f}" for v in os.getloadavg())  # noqa: E731
    meta: dict[str, Any] = {
        "started_utc": now_utc(),
        "load_start": loadavg(),
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
        runs, loads = asyncio.run(_measure(servers, body, args.frames, args.fps, args.repeats))
    meta |= {"load_end": loadavg(), "finished_utc": now_utc()}
    result = {
        "meta": meta,
        "configs": {
            label: {
                "summary": arms.summarize(runs[label], loads[label]),
                # The traces are summarized in the stages; without them the file stays small.
                "runs": [{k: v for k, v in run.items() if k != "trace"} for run in runs[label]],
            }
            for label in runs
        },
        "vaecast_vs_first": vaecast_against_first(runs),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "before_after.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "before_after.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
