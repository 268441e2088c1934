"""Thumbnails and spritesheets made from a stream's own fragments (`codecs.stills`)."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from vaecast.codecs.colour import from_rgb
from vaecast.codecs.encoder_settings import EncoderSettings
from vaecast.codecs.stills import (
    MAX_TILES,
    VideoUnits,
    make_spritesheet,
    make_thumbnail,
    sprite_frames,
    thumbnail_frame,
)
from vaecast.codecs.stream import VideoStreamEncoder

WIDTH, HEIGHT = 96, 64


def shaded_frames(count: int) -> np.ndarray:
    """Frame i is one flat grey, 40 + 6 i: which frame a still shows is its mean."""
    levels = 40 + 6 * np.arange(count, dtype=np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (count, HEIGHT, WIDTH, 3)).copy()


def shade_of(rgb: np.ndarray) -> int:
    return round((float(rgb.mean()) - 40) / 6)


def encode(counts: tuple[int, ...], keyframe_interval_s: float = 2.0) -> tuple[bytes, list[bytes]]:
    settings = EncoderSettings(keyframe_interval_s=keyframe_interval_s)
    encoder = VideoStreamEncoder(WIDTH, HEIGHT, Fraction(8), settings)
    try:
        frames, start, fragments = from_rgb(shaded_frames(sum(counts))), 0, []
        for count in counts:
            fragments.append(bytes(encoder.encode_chunk(frames[start : start + count])))
            start += count
        return bytes(encoder.init_segment), fragments
    finally:
        encoder.close()


def test_the_frames_chosen_cover_what_there_is() -> None:
    assert thumbnail_frame(1) == 0 and thumbnail_frame(17) == 8 and thumbnail_frame(4) == 1
    assert sprite_frames(1) == (0,)
    assert sprite_frames(4) == (0, 1, 2, 3)
    assert sprite_frames(160) == tuple(range(5, 160, 10))
    for frames in range(1, 200):
        chosen = sprite_frames(frames)
        assert len(chosen) == min(frames, MAX_TILES)
        assert list(chosen) == sorted(set(chosen)) and chosen[-1] < frames


@pytest.mark.parametrize("keyframe_interval_s", [0.25, 2.0])
def test_each_frame_decodes_to_itself_from_its_keyframe(keyframe_interval_s: float) -> None:
    init, fragments = encode((1, 4, 4, 4, 4), keyframe_interval_s)
    video = VideoUnits(init, fragments)
    assert len(video) == 17
    # Wanted out of order and repeated, across keyframes: each is its own frame.
    decoded = video.decode([16, 3, 3, 9, 0, 8])
    assert {i: shade_of(rgb) for i, rgb in decoded.items()} == {i: i for i in decoded}
    assert all(rgb.shape == (HEIGHT, WIDTH, 3) for rgb in decoded.values())


@pytest.mark.parametrize("image_format,pillow_format", [("webp", "WEBP"), ("jpeg", "JPEG")])
def test_the_thumbnail_is_the_middle_frame_so_far(image_format: str, pillow_format: str) -> None:
    init, fragments = encode((1, 4, 4, 4, 4))
    for count, middle in ((1, 0), (3, 4), (5, 8)):  # fragments so far -> the middle frame
        still = make_thumbnail(VideoUnits(init, fragments[:count]), image_format)
        image = Image.open(io.BytesIO(still.data))
        assert image.format == pillow_format and image.size == (WIDTH, HEIGHT)
        assert still.frame == middle and shade_of(np.asarray(image.convert("RGB"))) == middle
        assert still.media_type == f"image/{image_format}"
    # The same fragments, the same bytes (a still made again has the same ETag).
    again = make_thumbnail(VideoUnits(init, fragments), image_format)
    assert again.data == make_thumbnail(VideoUnits(init, fragments), image_format).data


def test_the_spritesheet_grows_with_the_video() -> None:
    init, fragments = encode((1, 4, 4, 4, 4, 4, 4, 4, 4))  # 33 frames
    small = make_spritesheet(VideoUnits(init, fragments[:2]))  # 5 frames: 4 + 1 tiles
    assert small.layout is not None and small.layout.frames == (0, 1, 2, 3, 4)
    assert (small.layout.columns, small.layout.rows) == (4, 2)
    whole = make_spritesheet(VideoUnits(init, fragments))
    layout = whole.layout
    assert layout is not None and len(layout.frames) == MAX_TILES and layout.covered == 33
    assert (layout.columns, layout.rows, layout.tile_width, layout.tile_height) == (4, 4, 96, 64)
    image = np.asarray(Image.open(io.BytesIO(whole.data)).convert("RGB"))
    assert image.shape == (4 * HEIGHT, 4 * WIDTH, 3)
    for i, frame in enumerate(layout.frames):  # each tile is the frame the layout names
        row, column = divmod(i, 4)
        tile = image[row * HEIGHT : (row + 1) * HEIGHT, column * WIDTH : (column + 1) * WIDTH]
        assert shade_of(tile) == frame
    assert "covered=33" in layout.header() and "tile=96x64" in layout.header()


def test_wide_videos_get_tiles_160_wide() -> None:
    encoder = VideoStreamEncoder(320, 176, Fraction(8))
    try:
        fragment = encoder.encode_chunk(from_rgb(np.zeros((2, 176, 320, 3), np.uint8)))
        video = VideoUnits(bytes(encoder.init_segment), [bytes(fragment)])
    finally:
        encoder.close()
    sheet = make_spritesheet(video)
    assert sheet.layout is not None and (sheet.layout.tile_width, sheet.layout.tile_height) == (
        160,
        88,
    )
    assert Image.open(io.BytesIO(sheet.data)).size == (2 * 160, 88)


def test_fragments_of_another_stream_are_refused() -> None:
    init, _ = encode((1, 4))
    with pytest.raises(ValueError):
        VideoUnits(init, [b"\x00\x00\x00\x08free"])
    assert len(VideoUnits(init, [])) == 0
