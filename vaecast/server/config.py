"""Server settings: limits, encoder options and defaults, in one frozen value."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from vaecast.codecs.h264 import EncoderSettings

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may ask for; past these the server answers 413."""

    max_upload_bytes: int = 512 * MIB
    max_frames: int = 2001
    max_pixels_per_frame: int = 1920 * 1088


@dataclass(frozen=True, slots=True)
class ServerConfig:
    default_model: str = "tiny"
    default_fps: Fraction = Fraction(16)
    device: str = "cpu"
    encoder: EncoderSettings = field(default_factory=EncoderSettings)
    limits: Limits = field(default_factory=Limits)
    decode_slots: int = 1
    # Chunks that may wait between the decoder thread and the encoder before the
    # decoder blocks: small, so memory stays O(chunk) however long the video.
    queue_chunks: int = 2
