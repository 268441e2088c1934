"""8-bit YUV 4:2:0 frames as the encoder takes them, and the BT.601 matrix that makes them.

The H.264 stream says (in its SPS VUI) BT.601 matrix, limited ("MPEG") range, 4:2:0
with the default chroma location (type 0: chroma co-sited with the even luma
columns, midway between two luma rows). `quantize.quantize_yuv420_to_host` produces
exactly that on the decoder's device, so the encoder can skip swscale. `from_rgb`
makes the same from 8-bit RGB on the host through swscale, for callers that hold RGB
frames (tests, benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable

import av
import numpy as np
from av.video.reformatter import ColorRange, Colorspace

# BT.601 luma weights (ITU-R BT.601-7, 2.5.1).
KR, KB = 0.299, 0.114
KG = 1.0 - KR - KB
# Limited range, 8 bit: Y in 16..235, Cb/Cr in 16..240 centred on 128.
LUMA_OFFSET, LUMA_SPAN = 16.0, 219.0
CHROMA_OFFSET, CHROMA_SPAN = 128.0, 224.0

# Rows: Y, Cb, Cr; columns: R, G, B in [0, 1]; add the offsets afterwards.
BT601_LIMITED: tuple[tuple[float, float, float], ...] = (
    (LUMA_SPAN * KR, LUMA_SPAN * KG, LUMA_SPAN * KB),
    (
        -CHROMA_SPAN * KR / (2 * (1 - KB)),
        -CHROMA_SPAN * KG / (2 * (1 - KB)),
        CHROMA_SPAN / 2,
    ),
    (
        CHROMA_SPAN / 2,
        -CHROMA_SPAN * KG / (2 * (1 - KR)),
        -CHROMA_SPAN * KB / (2 * (1 - KR)),
    ),
)
OFFSETS = (LUMA_OFFSET, CHROMA_OFFSET, CHROMA_OFFSET)


class Yuv420Frames:
    """T frames of 8-bit YUV 4:2:0 in I420 layout, BT.601 limited range.

    `planes` is one C-contiguous (T, H * 3 // 2, W) uint8 array: per frame the Y
    plane (H x W), then Cb and Cr (H/2 x W/2 each, packed row after row), which
    is the layout `av.VideoFrame.from_ndarray(..., format="yuv420p")` reads.

    A GPU decode hands over frames whose device-to-host copy may still be in flight
    (`quantize.quantize_yuv420_to_host`): `ready` is then the wait for that copy, and
    `planes` calls it before the first read, so the encode thread waits for the copy
    and the decode thread does not. The shape is known at once (`len`, `shape`).
    Immutable; not a dataclass only because `planes` is that waiting property.
    """

    __slots__ = ("_planes", "_ready", "height", "width")

    _planes: np.ndarray
    _ready: Callable[[], None] | None
    height: int
    width: int

    def __init__(
        self,
        planes: np.ndarray,
        height: int,
        width: int,
        ready: Callable[[], None] | None = None,
    ) -> None:
        expected = (height * 3 // 2, width)
        if (
            not isinstance(planes, np.ndarray)
            or planes.dtype != np.uint8
            or planes.ndim != 3
            or planes.shape[1:] != expected
            or height % 2
            or width % 2
        ):
            raise ValueError(
                f"planes must be a uint8 array of shape (T, {expected[0]}, {expected[1]}) "
                f"for even {width}x{height} frames, got "
                f"{getattr(planes, 'dtype', type(planes).__name__)} "
                f"{getattr(planes, 'shape', None)}"
            )
        object.__setattr__(self, "_planes", planes)
        object.__setattr__(self, "_ready", ready)
        object.__setattr__(self, "height", height)
        object.__setattr__(self, "width", width)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Yuv420Frames is immutable (tried to set {name!r})")

    def __repr__(self) -> str:
        pending = ", copy pending" if self._ready is not None else ""
        return f"Yuv420Frames({len(self)} frames, {self.width}x{self.height}{pending})"

    @property
    def planes(self) -> np.ndarray:
        """The frames' bytes, once a device copy still in flight has landed."""
        ready = self._ready
        if ready is not None:
            ready()  # idempotent: a finished copy returns at once
            object.__setattr__(self, "_ready", None)
        return self._planes

    @property
    def pending(self) -> bool:
        """Whether a device-to-host copy may still be writing `planes`."""
        return self._ready is not None

    def __len__(self) -> int:
        return int(self._planes.shape[0])

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(T, H, W, 3): the shape of the RGB frames these stand for."""
        return (len(self), self.height, self.width, 3)

    def __getitem__(self, frames: slice) -> Yuv420Frames:
        return Yuv420Frames(self._planes[frames], self.height, self.width, self._ready)

    def plane(self, frame: int, index: int) -> np.ndarray:
        """Plane `index` (0 Y, 1 Cb, 2 Cr) of one frame, as an (h, w) view."""
        h, w = self.height, self.width
        flat = self.planes[frame].reshape(-1)
        if index == 0:
            return flat[: h * w].reshape(h, w)
        start = h * w + (index - 1) * (h // 2) * (w // 2)
        return flat[start : start + (h // 2) * (w // 2)].reshape(h // 2, w // 2)


def from_rgb(frames: np.ndarray) -> Yuv420Frames:
    """(T, H, W, 3) uint8 RGB -> `Yuv420Frames`, converted by swscale (BT.601, limited range)."""
    if (
        not isinstance(frames, np.ndarray)
        or frames.dtype != np.uint8
        or frames.ndim != 4
        or frames.shape[3] != 3
        or frames.shape[1] % 2
        or frames.shape[2] % 2
    ):
        raise ValueError(
            "frames must be a uint8 array of shape (T, H, W, 3) with even H and W, got "
            f"{getattr(frames, 'dtype', type(frames).__name__)} {getattr(frames, 'shape', None)}"
        )
    count, height, width = frames.shape[:3]
    planes = np.empty((count, height * 3 // 2, width), np.uint8)
    for index, rgb in enumerate(frames):
        planes[index] = (
            av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            .reformat(
                format="yuv420p", dst_colorspace=Colorspace.ITU601, dst_color_range=ColorRange.MPEG
            )
            .to_ndarray()
        )
    return Yuv420Frames(planes, height, width)
