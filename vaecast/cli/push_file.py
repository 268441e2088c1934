"""`vaecast push`: a latent file sent to a server's push session as a generator would send it.

The file is cut into blocks of `block_frames` latent frames; each is pushed after the
time a generator making `latent_fps` latent frames per second would take to make it,
counted from the end of the previous push (a generator calling `push` waits for it, so
backpressure slows it down as it would slow a real one). A file with `audio` carries,
in each block, the samples of that block's span of video.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TextIO

import numpy as np

from vaecast.client import DEFAULT_TIMEOUT_S, PushError, PushSession
from vaecast.errors import InvalidRequestError, VaecastError
from vaecast.latent_files import AUDIO_RATE_KEY, check_audio, load_latents
from vaecast.params import parse_fps

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_FPS = Fraction(16)  # the server's default, sent explicitly so the audio spans agree
# Causal video VAEs (Wan 2.1 geometry, `tiny`): latent frame 0 decodes to 1 video frame,
# every later one to 4.
FIRST_LATENT_FRAME_VIDEO_FRAMES = 1
LATER_LATENT_FRAME_VIDEO_FRAMES = 4


@dataclass(frozen=True, slots=True)
class Block:
    index: int
    start: int  # latent frames [start, stop)
    stop: int
    audio_start: int  # samples [audio_start, audio_stop) at the file's rate; 0, 0 without
    audio_stop: int
    generate_s: float  # how long the generator takes to make it

    @property
    def frames(self) -> int:
        return self.stop - self.start


def video_frames(latent_frames: int) -> int:
    """The video frames the first `latent_frames` latent frames decode to."""
    if latent_frames <= 0:
        return 0
    return FIRST_LATENT_FRAME_VIDEO_FRAMES + LATER_LATENT_FRAME_VIDEO_FRAMES * (latent_frames - 1)


def plan_blocks(
    latent_frames: int,
    block_frames: int,
    latent_fps: float,
    fps: Fraction,
    audio_sample_rate: int | None = None,
) -> list[Block]:
    """The blocks of a file of `latent_frames` latent frames; the last one may be shorter.

    `latent_fps` 0 pushes each block as soon as the previous one is taken. Audio sample
    boundaries are exact: video frame n starts at sample floor(n * rate / fps).
    """
    if block_frames < 1:
        raise InvalidRequestError(f"--block-frames must be at least 1, got {block_frames}")
    if not latent_fps >= 0:  # NaN too
        raise InvalidRequestError(f"--latent-fps must be 0 or more, got {latent_fps}")

    def sample(latent_frame: int) -> int:
        if audio_sample_rate is None:
            return 0
        return int(video_frames(latent_frame) * audio_sample_rate / fps)  # Fraction: exact

    blocks = []
    for index, start in enumerate(range(0, latent_frames, block_frames)):
        stop = min(start + block_frames, latent_frames)
        generate_s = (stop - start) / latent_fps if latent_fps else 0.0
        blocks.append(Block(index, start, stop, sample(start), sample(stop), generate_s))
    return blocks


def push_file(
    path: Path,
    url: str = DEFAULT_URL,
    *,
    latent_fps: float,
    block_frames: int = 1,
    model: str | None = None,
    fps: str | None = None,
    api_key: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Push `path` to the server at `url`, saying where to watch and what each block did.

    The command's exit status: 0 when the final mark went out, 130 when interrupted (the
    job is then cancelled). The server's refusals raise VaecastError with its status.
    """
    out = out or sys.stdout
    latent_file = load_latents(path.read_bytes())
    latents = latent_file.latents  # BCTHW float32
    metadata = latent_file.metadata
    frame_rate = parse_fps(fps or metadata.get("fps"), DEFAULT_FPS)
    waveform: np.ndarray | None = None
    sample_rate: int | None = None
    if latent_file.audio is not None:
        waveform, sample_rate = check_audio(latent_file.audio, metadata.get(AUDIO_RATE_KEY))
    blocks = plan_blocks(latents.shape[2], block_frames, latent_fps, frame_rate, sample_rate)

    session = PushSession(
        url,
        fps=frame_rate,
        model=model or metadata.get("model"),
        api_key=api_key,
        audio_sample_rate=sample_rate,
        audio_channels=None if waveform is None else waveform.shape[0],
        timeout=timeout,
    )
    job_id = None
    try:
        with session:
            job_id = session.id
            print(f"watch: {session.watch_url}", file=out, flush=True)
            print(f"page:  {session.page_url}", file=out, flush=True)
            for block in blocks:
                sleep(block.generate_s)
                audio = None
                if waveform is not None and waveform.shape[1] > block.audio_start:
                    # A soundtrack shorter than the video ends early: the server pads.
                    audio = waveform[:, block.audio_start : block.audio_stop]
                answer = session.push(latents[:, :, block.start : block.stop], audio)
                print(_block_line(block, len(blocks), answer), file=out, flush=True)
    except KeyboardInterrupt:
        cancelled = "" if job_id is None else f"; job {job_id} cancelled"
        print(f"vaecast: interrupted{cancelled}", file=sys.stderr)
        return 130
    except PushError as error:  # `vaecast: error: HTTP 409 conflict: ...`, status included
        raise VaecastError(str(error)) from error
    print(f"done: {latents.shape[2]} latent frames in {len(blocks)} blocks, final sent", file=out)
    return 0


def _block_line(block: Block, count: int, answer: dict[str, object]) -> str:
    span = f"{block.start}" if block.frames == 1 else f"{block.start}-{block.stop - 1}"
    return (
        f"block {block.index + 1}/{count}: latent frame(s) {span} -> "
        f"{answer.get('latent_frames')} received, {answer.get('frames_done')} frames done"
    )
