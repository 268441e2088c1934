"""`vaecast latents --video` keeps the file's soundtrack, or says why it cannot (issue 36).

The videos are made here with PyAV: 17 frames at 16 fps (1.0625 s) and a 440 Hz tone
that runs past them, in the layouts a user's files come in.
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from safetensors import safe_open

from vaecast.cli import main
from vaecast.demo.video_soundtrack import read_soundtrack

FRAMES, FPS = 17, 16
SECONDS = Fraction(FRAMES, FPS)
TONE_HZ = 440
AMPLITUDE = 0.5


def make_video(
    path: Path,
    rate: int | None = 44_100,
    layout: str = "stereo",
    codec: str = "aac",
    audio_start_s: float = 0.0,
) -> Path:
    """A 64x48 video with a tone 0.25 s longer than it (`rate` None: no audio)."""
    with av.open(str(path), "w") as out:
        video = out.add_stream("libx264", rate=FPS)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        audio = None if rate is None else out.add_stream(codec, rate=rate, layout=layout)
        for index in range(FRAMES):
            image = np.full((48, 64, 3), index * 12, np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = index
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        if audio is None or rate is None:
            return path
        samples = int(rate * SECONDS) + rate // 4
        tone = AMPLITUDE * np.sin(2 * np.pi * TONE_HZ * np.arange(samples) / rate)
        channels = av.AudioLayout(layout).nb_channels
        planes = np.tile(tone.astype(np.float32), (channels, 1))
        packed = audio.codec_context.format.name == "s16"
        for start in range(0, samples, 1024):
            block = np.ascontiguousarray(planes[:, start : start + 1024])
            if packed:  # PCM: interleaved 16-bit
                block = (block.T * 32767).astype(np.int16).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(
                block, format="s16" if packed else "fltp", layout=layout
            )
            frame.sample_rate = rate
            frame.pts = start + round(audio_start_s * rate)
            out.mux(audio.encode(frame))
        out.mux(audio.encode(None))
    return path


def vaecast(*arguments: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "vaecast", *map(str, arguments)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def tone_of(waveform: np.ndarray, rate: int) -> tuple[float, float]:
    """(the loudest frequency in Hz, the RMS) of the first channel."""
    spectrum = np.abs(np.fft.rfft(waveform[0]))
    return float(np.argmax(spectrum) * rate / waveform.shape[1]), float(
        np.sqrt(np.mean(waveform[0] ** 2))
    )


def test_the_videos_sound_is_in_its_latents_and_in_their_decoded_mp4(tmp_path: Path) -> None:
    source = make_video(tmp_path / "clip.mp4")
    latents, decoded = tmp_path / "clip.safetensors", tmp_path / "decoded.mp4"
    made = vaecast("latents", "--video", source, "-o", latents)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == f"wrote {latents}: latents (1, 16, 5, 6, 8), 16 fps with sound"
    with safe_open(str(latents), "pt") as handle:
        assert handle.metadata()["audio_sample_rate"] == "44100"
        # As long as the 17 frames the latents hold, not the file's longer tone.
        assert tuple(handle.get_tensor("audio").shape) == (2, 46_857)  # ceil(1.0625 * 44100)

    assert main(["decode", str(latents), "-o", str(decoded)]) == 0  # default model: tiny
    with av.open(str(decoded)) as container:
        (stream,) = container.streams.audio
        assert (stream.codec_context.name, stream.sample_rate, stream.channels) == (
            "aac",
            44_100,
            2,
        )
        heard = np.concatenate([frame.to_ndarray() for frame in container.decode(audio=0)], axis=1)
    assert abs(heard.shape[1] - 46_857) < 1024  # the video's length, to an AAC frame
    frequency, rms = tone_of(heard, 44_100)
    assert abs(frequency - TONE_HZ) < 2
    assert abs(rms - AMPLITUDE / np.sqrt(2)) < 0.03


def test_sound_the_cli_cannot_read_is_one_line_and_no_file(tmp_path: Path) -> None:
    # A Matroska file whose audio codec id no FFmpeg knows (a PCM stream's, renamed).
    pcm = make_video(tmp_path / "pcm.mkv", codec="pcm_s16le").read_bytes()
    assert pcm.count(b"A_PCM/INT/LIT") == 1
    source = tmp_path / "odd.mkv"
    source.write_bytes(pcm.replace(b"A_PCM/INT/LIT", b"A_XYZ/INT/LIT"))
    latents = tmp_path / "odd.safetensors"
    refused = vaecast("latents", "--video", source, "-o", latents)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"vaecast: error: {source}: its audio (no codec) cannot be read: FFmpeg has no "
        "decoder for it; --no-sound makes the latents without it"
    ]
    assert not latents.exists()
    # As the line says: without the sound, the latents are made.
    assert main(["latents", "--video", str(source), "--no-sound", "-o", str(latents)]) == 0
    with safe_open(str(latents), "pt") as handle:
        assert list(handle.keys()) == ["latents"]
        assert "audio_sample_rate" not in handle.metadata()


@pytest.mark.parametrize(
    ("rate", "layout", "codec", "read_rate", "read_channels"),
    [
        (8_000, "mono", "aac", 16_000, 1),  # below AAC's range here: resampled up
        (48_000, "5.1", "aac", 48_000, 2),  # mixed down to stereo
        (44_100, "stereo", "pcm_s16le", 44_100, 2),  # another codec and container
    ],
)
def test_a_soundtrack_is_read_as_the_latent_file_carries_audio(
    tmp_path: Path, rate: int, layout: str, codec: str, read_rate: int, read_channels: int
) -> None:
    suffix = ".mkv" if codec.startswith("pcm") else ".mp4"
    source = make_video(tmp_path / f"clip{suffix}", rate, layout, codec)
    soundtrack = read_soundtrack(source, 0.0, SECONDS)
    assert soundtrack is not None
    waveform = soundtrack.waveform
    assert (soundtrack.sample_rate, waveform.dtype) == (read_rate, np.float32)
    assert waveform.shape == (read_channels, -(-FRAMES * read_rate // FPS))
    assert float(np.abs(waveform).max()) <= 1.0
    frequency, _ = tone_of(waveform, read_rate)
    assert abs(frequency - TONE_HZ) < 2


def test_the_sound_lines_up_with_the_first_frame_kept(tmp_path: Path) -> None:
    rate = 44_100
    # Audio that starts 0.5 s after the video: silence before it.
    late = read_soundtrack(
        make_video(tmp_path / "late.mkv", codec="pcm_s16le", audio_start_s=0.5), 0.0, SECONDS
    )
    assert late is not None
    lead = int(np.argmax(np.abs(late.waveform[0]) > 1e-3))
    assert abs(lead - rate // 2) <= 2
    # Video kept from 0.25 s on (as if its first frame were there): the audio from then.
    source = make_video(tmp_path / "clip.mkv", codec="pcm_s16le")
    whole = read_soundtrack(source, 0.0, SECONDS)
    later = read_soundtrack(source, 0.25, SECONDS - Fraction(1, 4))
    assert whole is not None and later is not None
    cut = round(0.25 * rate)
    np.testing.assert_array_equal(later.waveform, whole.waveform[:, cut:])


def test_a_soundtrack_an_hour_from_the_frames_is_never_held(tmp_path: Path) -> None:
    """The offset of a file's audio is the file's to say: an hour of silence before
    it, or of audio before the first frame kept, is neither allocated nor kept."""
    hours_later = make_video(tmp_path / "later.mkv", codec="pcm_s16le", audio_start_s=3_600.0)
    tracemalloc.start()
    try:
        assert read_soundtrack(hours_later, 0.0, SECONDS) is None  # no sound with the frames
        source = make_video(tmp_path / "clip.mkv", codec="pcm_s16le")
        assert read_soundtrack(source, 3_600.0, SECONDS) is None  # it ended long before
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # a 17-frame clip's sound, not an hour of it


def test_a_video_without_sound_makes_latents_without_it(tmp_path: Path) -> None:
    source = make_video(tmp_path / "silent.mp4", rate=None)
    assert read_soundtrack(source, 0.0, SECONDS) is None
