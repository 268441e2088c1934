"""`vaecast decode`'s progress: redrawn in place on a terminal, a few plain lines elsewhere."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from tests.helpers import safetensors_bytes, smooth_latents
from vaecast.cli.progress import DecodeProgress
from vaecast.pipeline.run import FragmentDone


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_chunks(progress: DecodeProgress, chunks: int, ok: bool = True) -> None:
    progress.started("video/mp4")
    for index in range(chunks):
        progress.fragment(FragmentDone(index, chunks, 4 * index, 4, 100, 0.0, 0.0))
    progress.finish(ok)


def test_a_log_gets_a_line_per_tenth_of_the_chunks_and_no_redraws():
    log = io.StringIO()
    run_chunks(DecodeProgress(chunks=95, frames=380, out=log), 95)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert len(lines) == 10
    assert lines[0].startswith("10/95 chunks 40/380 frames")
    assert lines[-1].startswith("95/95 chunks 380/380 frames")


def test_a_short_decode_logs_each_chunk_once_and_a_failure_says_where():
    log = io.StringIO()
    run_chunks(DecodeProgress(chunks=3, frames=12, out=log), 2, ok=False)
    lines = log.getvalue().splitlines()
    assert [line.split(" frames")[0] for line in lines] == [
        "1/3 chunks 4/12",
        "2/3 chunks 8/12",
        "failed at 2/3 chunks 8/12",
    ]


def test_a_terminal_gets_one_line_redrawn():
    terminal = Terminal()
    run_chunks(DecodeProgress(chunks=4, frames=16, out=terminal), 4)
    text = terminal.getvalue()
    assert text.count("\r") == 5  # the empty bar, then one per chunk
    assert text.endswith("\n") and text.count("\n") == 1
    assert "[" + "#" * 30 + "] 4/4 chunks 16/16 frames" in text


def test_the_command_writes_no_redraws_into_a_log_file(tmp_path: Path):
    latents = tmp_path / "z.safetensors"
    latents.write_bytes(safetensors_bytes(metadata={"fps": "8"}, latents=smooth_latents(3)))
    log = tmp_path / "decode.log"
    with log.open("w") as stderr:
        command = ["decode", str(latents), "-o", str(tmp_path / "x.mp4"), "--model", "linear"]
        subprocess.run(
            [sys.executable, "-m", "vaecast", *command],
            stderr=stderr,
            check=True,
            timeout=120,
        )
    text = log.read_text()
    assert "\r" not in text
    assert [line.split(" frames")[0] for line in text.splitlines()] == [
        "1/3 chunks 1/9",
        "2/3 chunks 5/9",
        "3/3 chunks 9/9",
    ]
