"""Latents that do not come from a diffusion model: demo scenes and video files.

Both are encoded with the embedded `tiny` encoder, so their latents are in the
`tiny` decoder's latent space (16 channels, Wan 2.1 geometry). The server's demo
request (`POST /v1/videos` with a JSON body) and `vaecast latents` use this module:
it checks a request's scene fields and video geometry, renders and encodes the
scene, and gives its soundtrack, whole or a span of frames at a time (the live
producer of `live` renders and encodes a block at a time).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import torch

from vaecast.demo.scenes import SCENE_NAMES, render_scene
from vaecast.demo.soundtrack import DEFAULT_SAMPLE_RATE_HZ, scene_soundtrack
from vaecast.errors import InvalidRequestError
from vaecast.models import base as models_base
from vaecast.models.tiny import encode_video

DEMO_DEFAULTS: dict[str, Any] = {
    "scene": "showcase",
    "frames": 81,
    "width": 832,
    "height": 480,
    "seed": 0,
}
SPATIAL_MULTIPLE = 8
MAX_SEED = 2**32 - 1  # what torch.Generator.manual_seed takes without overflow
TEMPORAL_STEP = 4


@dataclass(frozen=True, slots=True)
class SceneSpec:
    """A checked demo request: which scene, how long, how large, which seed."""

    scene: str
    frames: int
    width: int
    height: int
    seed: int = 0


def parse_scene_spec(body: dict[str, Any]) -> SceneSpec:
    """Check a demo request's scene fields (unknown fields are left to the caller)."""
    values = {**DEMO_DEFAULTS, **{k: body[k] for k in DEMO_DEFAULTS if k in body}}
    if values["scene"] not in SCENE_NAMES:
        raise InvalidRequestError(
            f"unknown scene {values['scene']!r}; known scenes: {', '.join(SCENE_NAMES)}"
        )
    for name in ("frames", "width", "height", "seed"):
        if not isinstance(values[name], int) or isinstance(values[name], bool):
            raise InvalidRequestError(f"{name} must be an integer, got {values[name]!r}")
    if not 0 <= values["seed"] <= MAX_SEED:
        raise InvalidRequestError(f"seed must be an integer from 0 to {MAX_SEED}")
    spec = SceneSpec(**values)
    check_video_geometry(spec.frames, spec.width, spec.height)
    return spec


def check_video_geometry(frames: int, width: int, height: int) -> None:
    """Refuse a size `tiny`'s latent geometry cannot represent (the models' one rule)."""
    models_base.check_video_geometry(frames, width, height, SPATIAL_MULTIPLE, TEMPORAL_STEP)


def scene_latents(spec: SceneSpec, device: str = "cpu") -> torch.Tensor:
    """Render the scene and encode it: BCTHW latents. Blocking: seconds at 832x480."""
    video = render_scene(spec.scene, spec.frames, spec.height, spec.width, seed=spec.seed)
    return encode_video(video, device=device)


def scene_audio(
    spec: SceneSpec, fps: Fraction, sample_rate: int = DEFAULT_SAMPLE_RATE_HZ
) -> np.ndarray:
    """The scene's soundtrack at `fps`, (2, samples) float32: clicks on bounces, a tone."""
    return scene_soundtrack(
        spec.scene, spec.frames, spec.height, spec.width, fps, spec.seed, sample_rate
    )


def scene_audio_span(
    spec: SceneSpec,
    fps: Fraction,
    first_frame: int,
    frames: int,
    sample_rate: int = DEFAULT_SAMPLE_RATE_HZ,
) -> np.ndarray:
    """The soundtrack of video frames first_frame..first_frame + frames - 1, (2, n) float32.

    It is that slice of `scene_audio(spec, fps)` bit for bit (samples `sample_at(first)`
    up to `sample_at(first + frames)`), made without the rest of the track, so a live
    producer's spans concatenate to the whole soundtrack.
    """
    return scene_soundtrack(
        spec.scene,
        spec.frames,
        spec.height,
        spec.width,
        fps,
        spec.seed,
        sample_rate,
        span=(first_frame, frames),
    )


@dataclass(frozen=True, slots=True)
class VideoFile:
    """The frames of a video file that its latents encode, and when they play."""

    pixels: torch.Tensor  # (1, 3, T, H, W) float in [0, 1]
    fps: Fraction
    start_s: float  # the first frame's time in the file (where its soundtrack lines up)

    @property
    def seconds(self) -> Fraction:
        return self.pixels.shape[2] / self.fps


def read_video_file(path: Path, max_frames: int | None = None) -> VideoFile:
    """Read a video file's frames with PyAV, as its latents can hold them.

    The frame count is cut down to the largest 1 + 4k that fits, and each side to a
    multiple of 8 (cropped from the bottom/right), because that is what the
    latent geometry can represent.
    """
    frames: list[np.ndarray] = []
    start_s = 0.0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate or Fraction(16)
        for frame in container.decode(stream):
            if not frames and frame.time is not None:
                start_s = frame.time
            frames.append(frame.to_ndarray(format="rgb24"))
            if max_frames is not None and len(frames) >= max_frames:
                break
    if not frames:
        raise InvalidRequestError(f"{path} has no video frames")
    count = 1 + (len(frames) - 1) // TEMPORAL_STEP * TEMPORAL_STEP
    height = frames[0].shape[0] // SPATIAL_MULTIPLE * SPATIAL_MULTIPLE
    width = frames[0].shape[1] // SPATIAL_MULTIPLE * SPATIAL_MULTIPLE
    check_video_geometry(count, width, height)
    pixels = np.stack(frames[:count])[:, :height, :width]
    video = torch.from_numpy(pixels).permute(3, 0, 1, 2).unsqueeze(0).float() / 255.0
    return VideoFile(video, Fraction(rate), start_s)
