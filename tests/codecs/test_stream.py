"""A whole stream: chunks in, init + one fragment per chunk out, decodable by FFmpeg."""

from __future__ import annotations

import io
from collections.abc import Iterator
from fractions import Fraction

import av
import numpy as np
import pytest

from tests.helpers.media import gradient_frames, gradient_yuv
from vaecast.codecs.colour import Yuv420Frames, from_rgb
from vaecast.codecs.fmp4_reader import iter_boxes, parse_fragment, parse_init_segment
from vaecast.codecs.stream import VIDEO_TRACK_ID, VideoStreamEncoder

WIDTH, HEIGHT = 64, 48
CHUNK_FRAMES = (1, 4, 4)
# The default settings keep this clip well above it (benchmarks/results/codecs_notes.md);
# a frame out of place or a colour-matrix mismatch lands near 20 dB.
PSNR_FLOOR_DB = 32.0


def psnr_db(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255**2 / mse))


def decode_all(data: bytes) -> list[av.VideoFrame]:
    with av.open(io.BytesIO(data)) as container:
        return list(container.decode(video=0))


@pytest.fixture
def stream() -> Iterator[VideoStreamEncoder]:
    encoder = VideoStreamEncoder(WIDTH, HEIGHT, Fraction(16))
    yield encoder
    encoder.close()


def encode_chunks(
    stream: VideoStreamEncoder, source: np.ndarray, counts: tuple[int, ...] = CHUNK_FRAMES
) -> list[bytes]:
    fragments, start, frames = [], 0, from_rgb(source)
    for count in counts:
        fragments.append(stream.encode_chunk(frames[start : start + count]))
        start += count
    return fragments


def test_stream_decodes_to_the_source_frames(stream: VideoStreamEncoder) -> None:
    source = gradient_frames(sum(CHUNK_FRAMES), WIDTH, HEIGHT)
    data = stream.init_segment + b"".join(encode_chunks(stream, source))
    frames = decode_all(data)
    assert len(frames) == len(source)
    assert {(f.width, f.height) for f in frames} == {(WIDTH, HEIGHT)}
    assert [f.pts for f in frames] == [i * 1000 for i in range(len(source))]
    assert frames[0].time_base == Fraction(1, 16000)
    for index, frame in enumerate(frames):
        assert psnr_db(frame.to_ndarray(format="rgb24"), source[index]) > PSNR_FLOOR_DB, index


def test_one_fragment_per_chunk(stream: VideoStreamEncoder) -> None:
    fragments = encode_chunks(stream, gradient_frames(sum(CHUNK_FRAMES), WIDTH, HEIGHT))
    decode_time = 0
    for number, (data, count) in enumerate(zip(fragments, CHUNK_FRAMES, strict=True), start=1):
        assert [b.type for b in iter_boxes(data)] == ["moof", "mdat"]
        parsed = parse_fragment(data)
        assert parsed.sequence_number == number
        (run,) = parsed.runs
        assert run.track_id == VIDEO_TRACK_ID
        assert run.base_media_decode_time == decode_time
        assert len(run.sample_sizes) == count
        decode_time += run.duration
    assert parse_fragment(fragments[0]).runs[0].run.samples[0].is_sync
    assert stream.frames_encoded == sum(CHUNK_FRAMES)
    assert stream.fragments_written == len(CHUNK_FRAMES)
    assert stream.decode_time == decode_time == 9000


def test_every_prefix_plays_its_chunks(stream: VideoStreamEncoder) -> None:
    # The progressive promise: each fragment is playable as soon as it is written.
    fragments = encode_chunks(stream, gradient_frames(sum(CHUNK_FRAMES), WIDTH, HEIGHT))
    for written in range(1, len(fragments) + 1):
        frames = decode_all(stream.init_segment + b"".join(fragments[:written]))
        assert len(frames) == sum(CHUNK_FRAMES[:written])


def test_init_segment_and_content_type(stream: VideoStreamEncoder) -> None:
    (track,) = parse_init_segment(stream.init_segment).tracks
    assert (track.track_id, track.width, track.height) == (VIDEO_TRACK_ID, WIDTH, HEIGHT)
    assert track.timescale == stream.timescale == 16000
    assert stream.codec_string.startswith("avc1.42C0")
    assert stream.content_type == f'video/mp4; codecs="{stream.codec_string}"'


def test_ntsc_rate_timestamps() -> None:
    encoder = VideoStreamEncoder(WIDTH, HEIGHT, Fraction(30000, 1001))
    try:
        data = encoder.init_segment + encoder.encode_chunk(gradient_yuv(3, WIDTH, HEIGHT))
    finally:
        encoder.close()
    frames = decode_all(data)
    assert [f.pts for f in frames] == [0, 1001, 2002]
    assert frames[0].time_base == Fraction(1, 30000)


def test_bad_chunks_are_refused_before_the_codec(stream: VideoStreamEncoder) -> None:
    with pytest.raises(ValueError, match="at least one frame"):
        stream.encode_chunk(
            Yuv420Frames(np.zeros((0, HEIGHT * 3 // 2, WIDTH), np.uint8), HEIGHT, WIDTH)
        )
    with pytest.raises(ValueError, match="must be Yuv420Frames"):
        stream.encode_chunk(np.zeros((1, HEIGHT, WIDTH, 3), np.uint8))  # type: ignore[arg-type]
    # Nothing reached the encoder, so the stream goes on with sequence number 1.
    data = stream.encode_chunk(gradient_yuv(2, WIDTH, HEIGHT))
    assert parse_fragment(data).sequence_number == 1
    assert stream.frames_encoded == 2


def test_closed_stream_refuses_chunks(stream: VideoStreamEncoder) -> None:
    stream.close()
    stream.close()
    with pytest.raises(RuntimeError, match="closed"):
        stream.encode_chunk(gradient_yuv(1, WIDTH, HEIGHT))
    with pytest.raises(RuntimeError, match="closed"):
        stream.encode_chunk(gradient_yuv(1, WIDTH, HEIGHT))
