"""The results: one JSON file, a Markdown table of the headline numbers, a PNG timeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import fanout, memory
from benchmarks.paired import MIN_REPEATS, PEER_ARMS, TARGETS, explain

ARM_TITLES = {
    "vaecast": "vaecast (progressive fMP4)",
    "decode_then_encode": "decode, then encode, then send",
    "preencode": "chunked pre-encode, sent at the end",
    "ffmpeg_pipe": "ffmpeg CLI pipe (frag_keyframe)",
}


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        f"# vaecast benchmarks ({meta['finished_utc']})",
        "",
        f"{meta['frames']} frames at {meta['width']}x{meta['height']}, {meta['fps']} fps, "
        f"model `{meta['model']}` (weights {meta.get('weights_sha256') or '-'}) on "
        f"{meta['device']}, x264 {meta['encoder']}, host frames {meta['host_frames']}; "
        f"{meta['repeats']} repeats of {meta.get('rounds', 1)} round(s) of pairs "
        "(medians; min-max in the JSON).",
        f"Machine: {meta['machine']}; load average at start {meta['load_start']}, "
        f"at end {meta['load_end']}.",
        "",
    ]
    measured = [
        f"{name} {report[name]['measured_utc']}"
        for name in ("arms", "fanout", "profile", "memory", "throughput")
        if name in report and "measured_utc" in report[name]
    ]
    if measured:
        lines[-1:-1] = ["Sections measured (UTC): " + ", ".join(measured) + "."]
    if "arms" in report:
        lines += _arms_table(report["arms"])
    if "memory" in report:
        lines += _memory_table(report["memory"])
    if "fanout" in report:
        lines += _fanout_table(report["fanout"])
    if "throughput" in report:
        lines += _throughput_table(report["throughput"])
    if "profile" in report:
        lines += _profile_table(report["profile"])
    return "\n".join(lines) + "\n"


def _arms_table(section: dict[str, Any]) -> list[str]:
    summary = section["summary"]
    refs = summary["references"]
    lines = [
        "## Time to watch, measured at the HTTP client (seconds from sending the request)",
        "",
        "| arm | first byte | first playable fragment | plays without a stall from | last byte "
        "| TTFF / first chunk decode+encode | total / max(decode, encode) "
        "| TTFF vs vaecast | total vs vaecast | MB | frames ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for arm, stats in summary["arms"].items():
        lines.append(
            f"| {ARM_TITLES.get(arm, arm)} | {_s(stats['ttfb_s']['median'])} "
            f"| {_s(stats['ttff_s']['median'])} | {_s(stats['smooth_start_s']['median'])} "
            f"| {_s(stats['last_byte_s']['median'])} "
            f"| {_x(stats['ttff_over_first_chunk'])} | {_x(stats['total_over_bound'])} "
            f"| {_x(stats['ttff_vs_vaecast'])} | {_x(stats['total_vs_vaecast'])} "
            f"| {stats['bytes'] / 1e6:.2f} | {'yes' if stats['frames_ok'] else 'NO'} |"
        )
    lines += [
        "",
        f"References, same latents, each stage alone: decode (+ quantize + host copy) "
        f"{refs['decode_only_s']:.2f} s (quantize {refs['decode_only_quantize_s']:.2f} s of it), "
        f"encode (x264 + colour conversion + boxes) {refs['encode_only_s']:.2f} s; "
        f"first chunk decode+encode {refs['first_chunk_decode_plus_encode_s']:.3f} s; "
        f"serial decode+encode {refs['serial_decode_plus_encode_s']:.2f} s. "
        "TTFF / first chunk and total / max(decode, encode) cannot go below 1.0; "
        "vaecast's and the vs-vaecast columns are medians of paired ratios (next "
        "section), the other arms' ratios to the references medians over all runs. "
        '"Plays without a stall from": the earliest start from which every fragment '
        "arrives before its media time comes (later than the first playable fragment "
        "when the decode runs slower than real time).",
        "",
    ]
    if "paired" in summary:
        lines += _paired_table(summary["paired"])
    if "stages" in summary:
        lines += _stages_table(summary["stages"], refs)
    return lines


def _stages_table(stages: dict[str, Any], refs: dict[str, Any]) -> list[str]:
    lines = [
        "## Where the time goes (server moments, medians over each arm's runs, ms)",
        "",
        "| vaecast, to the first fragment | ms |",
        "|---|---:|",
    ]
    for name, seconds in stages["vaecast"].get("ttff", {}).items():
        lines.append(f"| {name} | {1000 * seconds:.1f} |")
    arms = [arm for arm in stages if stages[arm].get("total")]
    names = list(dict.fromkeys(n for arm in arms for n in stages[arm]["total"]))
    lines += [
        "",
        f"First chunk alone: decode (+ quantize) and encode, "
        f"{1000 * refs['first_chunk_decode_plus_encode_s']:.1f} ms.",
        "",
        "| the whole video | " + " | ".join(ARM_TITLES.get(arm, arm) for arm in arms) + " |",
        "|---|" + "---:|" * len(arms),
    ]
    for name in names:
        cells = " | ".join(
            f"{1000 * stages[arm]['total'][name]:.0f}" if name in stages[arm]["total"] else "-"
            for arm in arms
        )
        lines.append(f"| {name} | {cells} |")
    lines += [
        "",
        f"The decode alone (decode_only: decode + quantize + host copy) took "
        f"{1000 * refs['decode_only_s']:.0f} ms, of which quantize "
        f"{1000 * refs['decode_only_quantize_s']:.0f} ms; the encode alone "
        f"{1000 * refs['encode_only_s']:.0f} ms. What a pipeline's decode takes beyond "
        "the decode alone is the cost of what runs beside it on the same cores.",
        "",
    ]
    return lines


RATIO_TITLES = {
    **{name: target.title for name, target in TARGETS.items()},
    **{f"total_over_{arm}": f"total / {ARM_TITLES[arm]}" for arm in PEER_ARMS},
    **{f"ttff_over_{arm}": f"TTFF / {ARM_TITLES[arm]}" for arm in PEER_ARMS},
}


def _paired_table(section: dict[str, Any]) -> list[str]:
    summary = section["summary"]
    loads = section["load"]
    lines = [
        "## vaecast against the targets: paired ratios",
        "",
        "Each repeat runs vaecast back to back with every other arm and reference, "
        "in one or more rounds (the order rotated every round); each ratio is computed "
        "within a round, from runs that met the same load, averaged over the repeat's "
        "rounds (geometric mean), then summarized over the repeats. A target is met "
        f"when the median meets it and the interquartile range does not straddle it "
        f"(at least {MIN_REPEATS} repeats); when the IQR straddles it, the run is too "
        "noisy to conclude.",
        "",
        "| vaecast's ratio | target | median | IQR | min-max | per repeat | verdict |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    names = [*TARGETS, *(n for n in summary if n not in TARGETS)]
    for name in names:
        if name not in summary:
            continue
        entry = summary[name]
        values = ", ".join(f"{r[name]:.2f}" for r in section["per_repeat"] if name in r)
        target = f"<= {entry['target']:.2f}" if "target" in entry else "-"
        verdict = explain(entry) if "target" in entry else "-"
        if "target" in entry and 2 * section["loaded_repeats"] > len(loads):
            verdict += f" (on a loaded machine: {section['loaded_repeats']}/{len(loads)} repeats)"
        lines.append(
            f"| {RATIO_TITLES.get(name, name)} | {target} | {entry['median']:.2f} "
            f"| {entry['q1']:.2f}-{entry['q3']:.2f} | {entry['low']:.2f}-{entry['high']:.2f} "
            f"| {values} | {verdict} |"
        )
    lines += [
        "",
        "Load during each repeat: CPU time other processes used (from /proc/stat, less "
        "the server's, its reaped children's such as ffmpeg, and the client's), as "
        f"average cores; a repeat over {section['loaded_cores']:.2f} core is marked loaded.",
        "",
        "| repeat | seconds | other processes, cores | steal, cores "
        "| load average (1 min) start-end | loaded |",
        "|---:|---:|---:|---:|---:|:-:|",
    ]
    for repeat in loads:
        start, end = repeat["loadavg_1min"]
        lines.append(
            f"| {repeat['repeat']} | {repeat['wall_s']:.1f} | {repeat['others_cores']:.2f} "
            f"| {repeat['steal_cores']:.2f} | {start:.2f}-{end:.2f} "
            f"| {'yes' if repeat['loaded'] else 'no'} |"
        )
    if section["loaded_repeats"]:
        lines += [
            "",
            f"{section['loaded_repeats']} of {len(loads)} repeats ran loaded: the ratios "
            "pair like with like, but the targets are for an idle machine and the "
            "seconds above do not describe one.",
        ]
    return [*lines, ""]


def _memory_table(section: dict[str, Any]) -> list[str]:
    return memory.table(section)


def _fanout_table(section: dict[str, Any]) -> list[str]:
    return fanout.table(section)


def _throughput_table(section: dict[str, Any]) -> list[str]:
    names = [
        ("vaecast_path", "vaecast path: quantize + encode_chunk"),
        ("vaecast_path_yuv420", "vaecast path, YUV 4:2:0 in torch"),
        ("quantize_rgb_before", "  quantize_to_host before the rewrite"),
        ("quantize_rgb", "  quantize_to_host (float -> uint8 RGB)"),
        ("quantize_yuv420_torch", "  quantize_yuv420_to_host (float -> I420, torch)"),
        ("swscale_rgb_to_yuv420", "  swscale RGB -> yuv420p"),
        ("encode_chunk_rgb", "  encode_chunk (swscale + x264 + boxes)"),
        ("ffmpeg_cli", "ffmpeg CLI, raw RGB pipe -> fMP4 (incl. process start)"),
    ]
    header = "| stage | " + " | ".join(
        f"{r['width']}x{r['height']} fps | ms/frame" for r in section["runs"]
    )
    lines = [
        "## Encode throughput on identical frames (no VAE time)",
        "",
        header + " |",
        "|---|" + "---:|---:|" * len(section["runs"]),
    ]
    for key, title in names:
        if key not in section["runs"][0]:
            continue
        cells = " | ".join(
            f"{r[key]['fps']:.0f} | {r[key]['ms_per_frame']:.2f}" for r in section["runs"]
        )
        lines.append(f"| {title} | {cells} |")
    startup = ", ".join(
        f"{r['ffmpeg_cli_startup']['seconds']:.2f} s at {r['width']}x{r['height']}"
        for r in section["runs"]
    )
    lines += ["", f"ffmpeg CLI for a single frame (process start and teardown): {startup}.", ""]
    return lines


def _profile_table(section: dict[str, Any]) -> list[str]:
    total = section["samples"] or 1
    lines = [
        "## Where the server's CPU time goes (py-spy, all threads, vaecast requests)",
        "",
        f"{section['samples']} samples at {section['sample_rate_hz']} Hz over "
        f"{section['elapsed_s']:.1f} s of requests; by thread: "
        + ", ".join(f"{name} {n}" for name, n in list(section["by_thread"].items())[:4])
        + ".",
        "",
        "| on the stack | share of busy samples |",
        "|---|---:|",
    ]
    for label, samples in section["hot_path_samples"].items():
        if samples:
            lines.append(f"| {label} | {100 * samples / total:.1f} % |")
    return [*lines, ""]


def timeline_png(timelines: list[dict[str, Any]], path: Path, title: str) -> None:
    """Per chunk: decoded, encoded, received by the client; one panel per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(timelines), 1, figsize=(10, 2.6 * len(timelines) + 0.6), sharex=True, squeeze=False
    )
    for axis, line in zip(axes[:, 0], timelines, strict=True):
        chunks = list(range(len(line["decoded_s"])))
        axis.plot(line["decoded_s"], chunks, "o", ms=3, label="decoded (server)")
        encoded = [(t, i) for i, t in enumerate(line["encoded_s"]) if t is not None]
        if encoded:
            axis.plot([t for t, _ in encoded], [i for _, i in encoded], "s", ms=3,
                      label="encoded (server)")  # fmt: skip
        received = line["received_s"][: len(chunks)]
        axis.plot(received, chunks[: len(received)], "^", ms=3, label="received (client)")
        axis.axvline(line["ttff_s"], color="grey", ls="--", lw=1, label="first playable (client)")
        axis.set_title(ARM_TITLES.get(line["arm"], line["arm"]), fontsize=10, loc="left")
        axis.set_ylabel("chunk")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the request was sent")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
