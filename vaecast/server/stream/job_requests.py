"""What a client asks the server to make: a whole video, a batch of them, a push session.

Pure values, checked by `vaecast.server.intake.uploads` before a job is made of them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fractions import Fraction

import torch

from vaecast.codecs.stream import Soundtrack
from vaecast.pipeline.run import AudioFormat


class PushKind(enum.Enum):
    """What a push session's blocks are."""

    LATENTS = "latents"
    FRAMES = "frames"


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """A whole video's latents, uploaded or rendered."""

    latents: torch.Tensor  # BCTHW float32, checked by vaecast.latent_files
    model: str
    fps: Fraction
    soundtrack: Soundtrack | None = None
    crop: tuple[int, int] | None = None  # (width, height): the decoded frames' top-left
    preview: str | None = None  # its preview decoder; None: the server's default for model
    webhook_url: str | None = None  # where its start and end are POSTed (checked)


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """An upload of B > 1 videos (a pipeline's `num_videos_per_prompt`): a job each."""

    videos: tuple[DecodeRequest, ...]


@dataclass(frozen=True, slots=True)
class PushRequest:
    """A push session: latents (or, `kind` "frames", frames a producer decoded) will
    arrive in blocks, with audio of this format if any."""

    model: str
    fps: Fraction
    audio_format: AudioFormat | None = None
    kind: PushKind = PushKind.LATENTS
    value_range: tuple[float, float] = (0.0, 1.0)  # of float frames
    crop: tuple[int, int] | None = None
    batch: int = 1  # videos pushed together (a job each)
    preview: str | None = None  # its preview decoder; None: the server's default for model
    webhook_url: str | None = None  # where its start and end are POSTed (checked)
    # The frames the producer expects to push, if it says: a viewer's stall-free start
    # is then predicted over the whole video, not only its next chunk.
    expected_frames: int | None = None


# A request's "preview" that asks for none, whatever the server's default.
NO_PREVIEW = "none"
