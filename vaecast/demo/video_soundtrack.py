"""The soundtrack of a video file that `vaecast latents --video` encodes.

A latent file carries audio as uploads do (`vaecast.latent_files.audio`): a float
tensor `audio`, (channels, samples) in [-1, 1], and its rate `audio_sample_rate`,
within what the AAC track takes (16-48 kHz, mono or stereo). The file's first audio
stream is decoded with PyAV and converted by FFmpeg's resampler to that: planar
float, its rate clamped into the range, more than two channels mixed down to
stereo. It is lined up with the video frames the latents hold: sample 0 plays with
their first frame (a stream that starts later is padded with silence, one that
starts earlier is cut), and only as much is read as those frames last (bounded
memory and time, however long the file's audio is).

A stream that cannot be read (no decoder for its codec, a channel layout the
resampler does not know, corrupt packets) is refused with one line, rather than
making latents that would decode silent without a word.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vaecast.codecs.aac import MAX_CHANNELS, MAX_SAMPLE_RATE_HZ, MIN_SAMPLE_RATE_HZ
from vaecast.codecs.stream import Soundtrack
from vaecast.errors import InvalidRequestError


def read_soundtrack(path: Path, start_s: float, seconds: Fraction) -> Soundtrack | None:
    """The audio of `path` from its time `start_s` (the first frame kept), `seconds`
    long; None for a file without an audio stream. Raises InvalidRequestError, naming
    the stream and why, for one that cannot be read."""
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                return None
            stream = container.streams.audio[0]
            try:
                return _decode(container, stream, start_s, seconds)
            except (av.FFmpegError, ValueError) as error:
                raise InvalidRequestError(
                    f"{path}: its audio ({_codec_name(stream)}) cannot be read: {error}; "
                    "--no-sound makes the latents without it"
                ) from None
    except av.FFmpegError as error:  # the container itself: as the video's reader says
        raise InvalidRequestError(f"{path}: {error}") from None


def _codec_name(stream: av.audio.stream.AudioStream) -> str:
    context = stream.codec_context
    return "no codec" if context is None else context.name


def _decode(
    container: av.container.InputContainer,
    stream: av.audio.stream.AudioStream,
    start_s: float,
    seconds: Fraction,
) -> Soundtrack | None:
    context = stream.codec_context
    if context is None:
        raise ValueError("FFmpeg has no decoder for it")
    rate = min(max(context.sample_rate, MIN_SAMPLE_RATE_HZ), MAX_SAMPLE_RATE_HZ)
    channels = 1 if min(context.channels, MAX_CHANNELS) == 1 else 2
    resampler = av.AudioResampler(
        format="fltp", layout="mono" if channels == 1 else "stereo", rate=rate
    )
    wanted = math.ceil(seconds * rate)
    pieces: list[np.ndarray] = []
    have = 0  # samples kept, the lead's silence included
    skip = 0  # samples before the first frame kept, still to drop
    started = False
    for frame in container.decode(stream):
        if not started:
            started = True
            first_s = frame.time if frame.time is not None else start_s
            lead = round((first_s - start_s) * rate)
            if lead >= wanted:  # it starts after the frames end: no sound with them
                return None
            # Silence before a stream that starts late, at most the frames' length; the
            # samples before the first frame of one that starts early are dropped as they
            # come (never held, however much earlier it starts).
            if lead > 0:
                pieces.append(np.zeros((channels, lead), np.float32))
                have = lead
            skip = max(0, -lead)
        for converted in resampler.resample(frame):
            have, skip = _keep(pieces, converted.to_ndarray(), have, skip)
        if have >= wanted:  # enough: the rest of the file is never decoded
            break
    for converted in resampler.resample(None):
        have, skip = _keep(pieces, converted.to_ndarray(), have, skip)
    if not pieces or have <= 0:  # no audio, or it ends before the first frame kept
        return None
    audio = np.concatenate(pieces, axis=1)[:, :wanted]
    audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
    return Soundtrack(np.ascontiguousarray(audio), rate)


def _keep(pieces: list[np.ndarray], samples: np.ndarray, have: int, skip: int) -> tuple[int, int]:
    """Append `samples` past the `skip` still to drop; the new (have, skip)."""
    dropped = min(skip, samples.shape[1])
    kept = samples[:, dropped:]
    if kept.shape[1]:
        pieces.append(kept)
    return have + kept.shape[1], skip - dropped
