"""SpareEncoders: one encoder opened ahead, handed to the next stream like the last."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from tests.helpers.media import gradient_yuv
from vaecast.codecs.aac import AudioSettings
from vaecast.codecs.h264 import EncoderSettings
from vaecast.codecs.stream import Soundtrack, VideoStreamEncoder
from vaecast.pipeline.encoder_spares import SpareEncoders

FPS = Fraction(24)


class CountingOpens:
    """A real encoder factory that records what it opened."""

    def __init__(self) -> None:
        self.opened: list[VideoStreamEncoder] = []

    def __call__(self, *args: Any, **kwargs: Any) -> VideoStreamEncoder:
        encoder = VideoStreamEncoder(*args, **kwargs)
        self.opened.append(encoder)
        return encoder


def test_the_next_stream_like_the_last_gets_the_spare() -> None:
    opens = CountingOpens()
    spares = SpareEncoders(opens)
    first = spares(64, 48, FPS, EncoderSettings(), total_frames=9)
    assert len(opens.opened) == 1 and spares.spare_key is None  # nothing ahead yet
    first.close()
    spares.replenish()
    assert len(opens.opened) == 2 and spares.spare_key is not None
    spares.replenish()  # one is open already: nothing more
    assert len(opens.opened) == 2
    second = spares(64, 48, FPS, EncoderSettings(), total_frames=13)
    assert second is opens.opened[1] and spares.handed_out == 1
    assert second.total_frames == 13
    assert spares.spare_key is None  # handed out: never twice
    third = spares(64, 48, FPS, EncoderSettings(), total_frames=13)
    assert third is opens.opened[2]
    for encoder in (second, third):
        encoder.close()
    spares.close()


@pytest.mark.parametrize(
    "other",
    [
        {"width": 80},
        {"fps": Fraction(25)},
        {"settings": EncoderSettings(crf=30)},
        {"audio": AudioSettings(48_000, 2)},
    ],
)
def test_a_different_stream_opens_its_own_and_the_spare_follows_it(other: dict[str, Any]) -> None:
    opens = CountingOpens()
    spares = SpareEncoders(opens)
    spares(64, 48, FPS, EncoderSettings()).close()
    spares.replenish()
    stale = opens.opened[-1]
    stream = {"width": 64, "height": 48, "fps": FPS, "settings": EncoderSettings(), **other}
    audio = stream.pop("audio", None)
    args = (stream["width"], stream["height"], stream["fps"], stream["settings"])
    fresh = spares(*args, audio=audio) if audio else spares(*args)
    assert fresh is opens.opened[-1] and fresh is not stale and spares.handed_out == 0
    fresh.close()
    spares.replenish()  # the spare now serves the stream asked for last; the old one closed
    assert stale._closed
    again = spares(*args, audio=audio) if audio else spares(*args)
    assert again is opens.opened[-1] and spares.handed_out == 1
    again.close()
    spares.close()


def test_a_stream_with_a_soundtrack_never_takes_a_spare() -> None:
    opens = CountingOpens()
    spares = SpareEncoders(opens)
    spares(64, 48, FPS).close()
    spares.replenish()
    spare = opens.opened[-1]
    sound = Soundtrack(np.zeros((1, 4800), np.float32), 48_000)
    with_sound = spares(64, 48, FPS, EncoderSettings(), sound, 9)
    assert with_sound is not spare and with_sound.codec_string.endswith("mp4a.40.2")
    assert spares.spare_key is not None  # still there for the next silent stream
    with_sound.close()
    spares.close()
    assert spare._closed


def test_a_spare_encodes_exactly_what_a_fresh_encoder_does() -> None:
    spares = SpareEncoders()
    spares(64, 48, FPS).close()
    spares.replenish()
    spare = spares(64, 48, FPS)
    fresh = VideoStreamEncoder(64, 48, FPS)
    frames = gradient_yuv(9)
    try:
        assert spare.init_segment == fresh.init_segment
        assert spare.encode_chunk(frames) == fresh.encode_chunk(frames)
        assert spare.finish() == fresh.finish()
    finally:
        spare.close()
        fresh.close()
        spares.close()


def test_after_close_nothing_is_opened_and_the_spare_is_closed() -> None:
    opens = CountingOpens()
    spares = SpareEncoders(opens)
    spares(64, 48, FPS).close()
    spares.replenish()
    spare = opens.opened[-1]
    spares.close()
    assert spare._closed and spares.spare_key is None
    spares.replenish()
    assert len(opens.opened) == 2


def test_a_failed_open_ahead_is_left_to_the_next_stream() -> None:
    calls = []

    def flaky(*args: Any, **kwargs: Any) -> VideoStreamEncoder:
        calls.append(args)
        if len(calls) == 2:
            raise RuntimeError("no encoder now")
        return VideoStreamEncoder(*args, **kwargs)

    spares = SpareEncoders(flaky)
    spares(64, 48, FPS).close()
    spares.replenish()  # fails quietly
    assert spares.spare_key is None
    encoder = spares(64, 48, FPS)  # opens its own
    assert len(calls) == 3
    encoder.close()
    spares.close()
