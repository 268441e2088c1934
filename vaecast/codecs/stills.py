"""Still images of a video: a thumbnail and a spritesheet, from its own MP4. No I/O.

A job's thumbnail and spritesheet are made from the fragments its log holds: the one
form of its frames that every job has (decoded here, pushed by a producer, decoded on
a Ray replica, or restored from the store after a restart), so a still is the picture
a viewer of the video sees. The fragments' H.264 is decoded back (libavcodec through
PyAV), only from the keyframe before each frame wanted up to that frame, and the
images are encoded by Pillow. Decoding a few frames back costs milliseconds where the
VAE spent seconds making them; `benchmarks.store` measures it.

The same fragments always give the same bytes (libavcodec's decode and Pillow's
encoders are deterministic), so a still made again after a restart has the ETag it
had before.

- The thumbnail is the frame in the middle of the frames so far (of the whole video
  once it is complete), as WebP, or JPEG where asked.
- The spritesheet is a JPEG grid of up to `MAX_TILES` frames, `SPRITE_COLUMNS` a row:
  each tile the middle frame of an equal share of the frames so far, so the sheet
  covers the video as far as it goes and grows with it. `SpriteLayout` says which
  frame each tile shows, for a player that scrubs with it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import av
import numpy as np
from PIL import Image

from vaecast.codecs.access_units import AccessUnit, AccessUnitReader
from vaecast.codecs.fmp4_reader import parse_init_segment

# Image formats a thumbnail is made in: the query's name -> Pillow's name, media type.
THUMBNAIL_FORMATS = {"webp": ("WEBP", "image/webp"), "jpeg": ("JPEG", "image/jpeg")}
SPRITESHEET_TYPE = "image/jpeg"
MAX_TILES = 16
SPRITE_COLUMNS = 4
TILE_WIDTH = 160  # at most: a smaller video's tiles are its own size
THUMBNAIL_QUALITY = 82
SPRITE_QUALITY = 80


@dataclass(frozen=True, slots=True)
class SpriteLayout:
    """Where each frame is on a spritesheet: tile i (row-major, `columns` a row) shows
    frame `frames[i]` of the `covered` frames the sheet was made from."""

    columns: int
    rows: int
    tile_width: int
    tile_height: int
    covered: int
    frames: tuple[int, ...]

    def header(self) -> str:
        """As the `X-Spritesheet` response header states it."""
        return (
            f"columns={self.columns}; rows={self.rows}; tile={self.tile_width}x"
            f"{self.tile_height}; covered={self.covered}; "
            f"frames={','.join(map(str, self.frames))}"
        )


@dataclass(frozen=True, slots=True)
class Still:
    """An encoded image and what it shows."""

    data: bytes
    media_type: str
    frame: int | None = None  # a thumbnail's frame
    layout: SpriteLayout | None = None  # a spritesheet's tiles


def thumbnail_frame(frames: int) -> int:
    """The frame a thumbnail of `frames` frames shows: the middle one."""
    return (frames - 1) // 2


def sprite_frames(frames: int, tiles: int = MAX_TILES) -> tuple[int, ...]:
    """The frames a spritesheet of `frames` frames shows: the middle of each of
    min(tiles, frames) equal shares."""
    count = min(tiles, frames)
    return tuple((2 * i + 1) * frames // (2 * count) for i in range(count))


class VideoUnits:
    """A video's H.264 access units, read from its init segment and fragments."""

    def __init__(self, init: bytes, fragments: Sequence[bytes]) -> None:
        reader = AccessUnitReader(parse_init_segment(init))
        self.width, self.height = reader.video.width, reader.video.height
        self.units: list[AccessUnit] = []
        for fragment in fragments:
            self.units.extend(reader.read(fragment).video)

    def __len__(self) -> int:
        return len(self.units)

    def decode(
        self, wanted: Sequence[int], size: tuple[int, int] | None = None
    ) -> dict[int, np.ndarray]:
        """Frames `wanted` (indices into the units) as (H, W, 3) uint8 RGB, each decoded
        from the keyframe at or before it (BT.601, limited range: what vaecast encodes),
        scaled to `size` (width, height) by swscale's area filter where given."""
        frames: dict[int, np.ndarray] = {}

        def rgb(frame: av.VideoFrame) -> np.ndarray:
            if size is None:
                return frame.to_ndarray(format="rgb24")
            width, height = size
            scaled = frame.reformat(width, height, "rgb24", interpolation="AREA")
            return scaled.to_ndarray()

        decoder: av.CodecContext | None = None
        position = 0  # the next unit the decoder would take
        for target in sorted(set(wanted)):
            start = self._keyframe_at_or_before(target)
            if decoder is None or not start <= position <= target:
                decoder, position = _h264_decoder(), start
            while position <= target:
                packet = av.Packet(self.units[position].data)
                packet.pts = position
                for frame in decoder.decode(packet):
                    if frame.pts in wanted:
                        frames[frame.pts] = rgb(frame)
                position += 1
            if target not in frames:  # a decoder that holds frames back: drain it
                for frame in decoder.decode(None):
                    if frame.pts in wanted:
                        frames[frame.pts] = rgb(frame)
                decoder = None
        missing = set(wanted) - frames.keys()
        if missing:
            raise ValueError(f"frames {sorted(missing)} did not decode")
        return frames

    def _keyframe_at_or_before(self, index: int) -> int:
        for position in range(index, -1, -1):
            if self.units[position].keyframe:
                return position
        raise ValueError("the video does not start with a keyframe")


def _h264_decoder() -> av.CodecContext:
    decoder = av.CodecContext.create("h264", "r")
    decoder.thread_count = 1  # a frame out per packet in, and one core
    return decoder


def make_thumbnail(video: VideoUnits, image_format: str = "webp") -> Still:
    """The thumbnail of the frames so far, in `image_format` (a THUMBNAIL_FORMATS key)."""
    pillow_format, media_type = THUMBNAIL_FORMATS[image_format]
    frame = thumbnail_frame(len(video))
    image = Image.fromarray(video.decode([frame])[frame])
    out = io.BytesIO()
    image.save(out, pillow_format, quality=THUMBNAIL_QUALITY)
    return Still(out.getvalue(), media_type, frame=frame)


def make_spritesheet(video: VideoUnits) -> Still:
    """The spritesheet of the frames so far."""
    frames = sprite_frames(len(video))
    tile_width = min(TILE_WIDTH, video.width)
    tile_height = max(1, round(video.height * tile_width / video.width))
    decoded = video.decode(frames, (tile_width, tile_height))
    columns = min(SPRITE_COLUMNS, len(frames))
    rows = -(-len(frames) // columns)
    layout = SpriteLayout(columns, rows, tile_width, tile_height, len(video), frames)
    sheet = Image.new("RGB", (columns * tile_width, rows * tile_height))
    for i, frame in enumerate(frames):
        tile = Image.fromarray(decoded[frame])
        sheet.paste(tile, ((i % columns) * tile_width, (i // columns) * tile_height))
    out = io.BytesIO()
    sheet.save(out, "JPEG", quality=SPRITE_QUALITY)
    return Still(out.getvalue(), SPRITESHEET_TYPE, layout=layout)
