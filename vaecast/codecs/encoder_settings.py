"""The x264 settings a deployment may change, as one frozen value (no PyAV here).

Kept apart from `vaecast.codecs.h264` so that what only reads or checks settings (the
CLI's parser and `--help`, the server's config) does not import the encoder and FFmpeg.
Why these defaults: see `vaecast.codecs.h264`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PRESET = "ultrafast"
DEFAULT_QP = 21
# x264's quantizer and rate factor scales, for 8-bit video.
MAX_QP = 51
# One x264 thread. Its default here (sliced threads under zerolatency: each frame cut
# into slices that threads encode and then wait for each other) bought ~10 % of wall
# time alone for ~25 % more CPU, and beside a decode that keeps every core busy the
# CPU is what counts (numbers: benchmarks/results/codecs_notes.md). 0 is x264's own
# choice, for a machine with cores to spare.
DEFAULT_THREADS = 1
MAX_THREADS = 16
DEFAULT_KEYFRAME_INTERVAL_S = 2.0


@dataclass(frozen=True, slots=True)
class EncoderSettings:
    """x264 knobs a deployment may change (why these: `vaecast.codecs.h264`)."""

    preset: str = DEFAULT_PRESET
    # x264's constant rate factor; None (the default) encodes at the constant `qp`.
    crf: int | None = None
    keyframe_interval_s: float = DEFAULT_KEYFRAME_INTERVAL_S
    threads: int = DEFAULT_THREADS
    qp: int = DEFAULT_QP

    def __post_init__(self) -> None:
        if not 0 <= self.threads <= MAX_THREADS:
            raise ValueError(f"threads must be in 0..{MAX_THREADS}, got {self.threads}")
        if self.crf is not None and not 0 <= self.crf <= MAX_QP:
            raise ValueError(f"crf must be in 0..{MAX_QP}, got {self.crf}")
        if not 0 <= self.qp <= MAX_QP:
            raise ValueError(f"qp must be in 0..{MAX_QP}, got {self.qp}")
        if not self.keyframe_interval_s > 0:
            raise ValueError(f"keyframe_interval_s must be > 0, got {self.keyframe_interval_s}")

    @property
    def rate_control(self) -> tuple[str, int]:
        """x264's rate-control option and its value: ("qp", 21), or ("crf", n) when set."""
        return ("qp", self.qp) if self.crf is None else ("crf", self.crf)
