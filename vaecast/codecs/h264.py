"""H.264 encoding of YUV 4:2:0 frames into fMP4-ready samples, through libx264 in PyAV.

The encoder is PyAV's bare `CodecContext` (no container: `fmp4.py` writes the
boxes; `avc.py` turns its Annex B output into `avc1` samples). Two settings carry
the streaming design:
- `tune=zerolatency`: no lookahead and no B-frames, so a frame in gives its packet
  out at once and a chunk's packets all land inside that chunk's fragment. The
  alternative, draining the encoder at each chunk end, ends it for good.
- `GLOBAL_HEADER`: SPS/PPS go to `extradata` at `open()`, so the avcC (and the
  init segment) exist before the first frame is decoded, and keyframes do not
  repeat them. Any SPS/PPS/AUD that still shows up in a packet is dropped from the
  sample (after checking it repeats the avcC's).

Defaults (the measurements are in benchmarks/results/codecs_notes.md): the encoder
shares the CPU with the decoder, so the preset is ultrafast, the only one with
throughput to spare when both run (~1.5-2x superfast's and veryfast's frames/s); its
Constrained Baseline profile (avc1.42C0xx) is also the most widely decodable.
Quality is a constant quantizer, QP 21, not x264's CRF: CRF weighs each frame on a
half-resolution copy that x264 builds and motion-searches for that alone, work a
constant QP skips. Since the encoder shares the cores with the decode, CPU is the
price that counts: QP 21 gives CRF 23's size and PSNR on the showcase for 0.84x
x264's CPU (codecs_notes.md, "Rate control"); `crf` brings CRF back. Ultrafast
spends more bits than the slower presets (no CABAC, no B-frames), a price paid in
bandwidth rather than latency. A keyframe every 2 s bounds how far a viewer
seeking into the stream has to decode. The second call (a stream's second chunk)
starts with a keyframe too, whatever the interval: the first fragment is then a
segment of its own, so a player that reads only whole HLS segments (FFmpeg, VLC,
AVPlayer) can start as soon as the second chunk is out instead of a keyframe interval
later. The interval counts on from that keyframe.

Colour: frames arrive as `Yuv420Frames`, BT.601 matrix in limited (MPEG) range,
and the same is written into the SPS VUI, so players invert exactly what was
applied and the encoder converts nothing.
"""

from __future__ import annotations

import math
from fractions import Fraction

import av
import numpy as np
from av.codec.context import Flags
from av.video.frame import PictureType
from av.video.reformatter import ColorPrimaries, ColorRange, Colorspace, ColorTrc

from vaecast.codecs.avc import (
    NAL_PPS,
    NAL_SPS,
    annexb_to_sample,
    avc_decoder_configuration_record,
    nal_unit_type,
    parse_sps_codec_string,
    split_annexb,
)
from vaecast.codecs.colour import Yuv420Frames
from vaecast.codecs.encoder_settings import EncoderSettings
from vaecast.codecs.fmp4 import Sample

__all__ = ["EncoderSettings", "H264Encoder", "media_timescale"]

DEFAULT_SETTINGS = EncoderSettings()
# Media timescales are 32-bit in mdhd.
_MAX_TIMESCALE_HZ = 0xFFFFFFFF
# Frame durations of at least this many ticks keep timestamps exact and fine-grained.
_MIN_FRAME_DURATION_TICKS = 1000

# FFmpeg's AVColorSpace for the BT.601 (525-line) matrix. PyAV's `Colorspace` enum
# holds swscale's SWS_CS_* numbers, where 5 is BT.601 but AVColorSpace 5 would
# tag BT.470BG; the matrices agree, the tag should match the primaries/trc below.
_AVCOL_SPC_SMPTE170M = 6


def media_timescale(fps: Fraction) -> tuple[int, int]:
    """(timescale, frame_duration) in integer ticks with fps == timescale / frame_duration.

    The frame duration is scaled up to at least 1000 ticks so that integer
    timestamps stay exact and readable: 16 fps -> (16000, 1000), 30000/1001 ->
    (30000, 1001), 25/2 -> (12500, 1000).
    """
    fps = Fraction(fps)
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    factor = math.ceil(_MIN_FRAME_DURATION_TICKS / fps.denominator)
    timescale, frame_duration = fps.numerator * factor, fps.denominator * factor
    if timescale > _MAX_TIMESCALE_HZ:
        raise ValueError(f"fps {fps} needs a timescale of {timescale} Hz, over 32 bits")
    return timescale, frame_duration


class H264Encoder:
    """One libx264 encoder for one whole stream; frames in, `Sample`s out.

    Not thread-safe by design: a stream owns one encoder and calls it from one
    thread at a time (the server runs `encode` in an executor, one job at a time).
    The codec is never drained mid-stream: draining ends it for good, and
    zerolatency makes it unnecessary.
    """

    def __init__(
        self,
        width: int,
        height: int,
        fps: Fraction,
        settings: EncoderSettings = DEFAULT_SETTINGS,
    ) -> None:
        if width <= 0 or height <= 0 or width % 2 or height % 2:
            # yuv420p subsamples chroma 2x2, so x264 needs even dimensions.
            raise ValueError(f"width and height must be positive and even, got {width}x{height}")
        self.width, self.height = width, height
        self.fps = Fraction(fps)
        self.settings = settings
        self.timescale, self.frame_duration = media_timescale(self.fps)
        self.keyframe_interval_frames = max(1, round(settings.keyframe_interval_s * self.fps))
        self.frames_encoded = 0
        self.calls = 0  # `encode` calls that encoded frames: a stream's chunks so far
        self._next_keyframe = 0

        context = av.CodecContext.create("libx264", "w")
        context.width, context.height = width, height
        context.pix_fmt = "yuv420p"
        context.time_base = Fraction(1, self.timescale)
        context.framerate = self.fps
        # Our keyframes come at call boundaries (below), up to a chunk after the interval:
        # x264's own limit must not put one first, in the middle of a chunk.
        context.gop_size = 2 * self.keyframe_interval_frames
        context.max_b_frames = 0
        context.thread_count = settings.threads
        context.flags |= Flags.global_header
        # What goes into the SPS VUI: what Yuv420Frames hold (BT.601, limited range).
        context.colorspace = _AVCOL_SPC_SMPTE170M
        context.color_range = ColorRange.MPEG
        context.color_primaries = ColorPrimaries.SMPTE170M
        context.color_trc = ColorTrc.SMPTE170M
        rate_control, quality = settings.rate_control
        context.options = {
            "preset": settings.preset,
            "tune": "zerolatency",
            rate_control: str(quality),
        }
        context.open()
        self._context: av.VideoCodecContext | None = context

        units = split_annexb(bytes(context.extradata or b""))
        sps_units = [u for u in units if nal_unit_type(u) == NAL_SPS]
        pps_units = [u for u in units if nal_unit_type(u) == NAL_PPS]
        if not sps_units or not pps_units:
            raise RuntimeError("libx264 gave no SPS/PPS in extradata despite GLOBAL_HEADER")
        self._parameter_sets = frozenset(sps_units + pps_units)
        self.avcc = avc_decoder_configuration_record(sps_units, pps_units)
        self.codec_string = parse_sps_codec_string(sps_units[0])

    def check_frames(self, frames: Yuv420Frames) -> None:
        """Raise ValueError unless `frames` is `Yuv420Frames` at this encoder's size."""
        if not isinstance(frames, Yuv420Frames):
            raise ValueError(
                "frames must be Yuv420Frames (colour.from_rgb converts RGB), "
                f"got {type(frames).__name__}"
            )
        if (frames.height, frames.width) != (self.height, self.width):
            raise ValueError(
                f"YUV 4:2:0 frames must be {self.width}x{self.height}, "
                f"got {frames.width}x{frames.height}"
            )

    def encode(self, frames: Yuv420Frames, keyframe: bool = False) -> list[Sample]:
        """Encode BT.601 limited-range 4:2:0 frames, as the stream declares (no
        conversion left to do); one Sample per frame, in order. `keyframe`: the first
        frame is one, whatever the interval (a point where a live rendition may switch
        to this stream, `vaecast.server.stream.live_rendition`)."""
        if self._context is None:
            raise RuntimeError("encoder is closed")
        self.check_frames(frames)
        samples = []
        for index in range(len(frames)):
            frame = self._from_i420(frames.planes[index])
            frame.pts = self.frames_encoded * self.frame_duration
            due = keyframe or self.calls == 1 or self.frames_encoded >= self._next_keyframe
            if index == 0 and due:
                # A keyframe starts the first call (a chunk, a fragment) at or past each
                # interval, whatever x264's scenecut does between: so a fragment starts
                # with one now and then, and HLS can start a segment there. The second
                # call starts one too, so that the first fragment is a segment alone;
                # and a call asked for one.
                frame.pict_type = PictureType.I
                self._next_keyframe = self.frames_encoded + self.keyframe_interval_frames
            packets = self._context.encode(frame)
            if len(packets) != 1:
                raise RuntimeError(
                    f"libx264 returned {len(packets)} packets for one frame; "
                    "zerolatency should give exactly one"
                )
            (packet,) = packets
            composition_offset = 0
            if packet.pts is not None and packet.dts is not None:
                composition_offset = packet.pts - packet.dts
            if composition_offset:
                raise RuntimeError(
                    f"unexpected frame reordering (pts - dts = {composition_offset})"
                )
            samples.append(
                Sample(
                    data=annexb_to_sample(bytes(packet), self._parameter_sets),
                    duration=self.frame_duration,
                    is_sync=packet.is_keyframe,
                    composition_offset=composition_offset,
                )
            )
            self.frames_encoded += 1
        if samples:
            self.calls += 1
        return samples

    def _from_i420(self, planes: np.ndarray) -> av.VideoFrame:
        # A frame over the planes' own memory, not a copy (`from_ndarray` copied
        # 600 KB a frame at 832x480: ~0.22 ms, 18 ms of the encode thread's CPU over
        # an 81-frame video). Safe: libx264 copies the picture into its own frame
        # before `encode` returns, and the planes outlive this call.
        if planes.shape[0] % 6:
            # PyAV wraps only heights that are multiples of 4 (its row count // 6 * 4):
            # another even height would be read as a shorter frame, its chroma from
            # the wrong rows. A copy handles every even height.
            frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
        else:
            frame = av.VideoFrame.from_numpy_buffer(np.ascontiguousarray(planes), format="yuv420p")
        # Tags only, as swscale's reformat() would leave them; the VUI comes from
        # the codec context.
        frame.colorspace = Colorspace.ITU601
        frame.color_range = ColorRange.MPEG
        return frame

    def close(self) -> None:
        """Release the codec; later calls to close() do nothing."""
        # PyAV has no explicit close for a CodecContext: dropping the last
        # reference frees the x264 encoder (deterministically, by refcount).
        self._context = None
