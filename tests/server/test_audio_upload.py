"""Latents with a soundtrack: both tracks in the stream; bad audio refused before decoding."""

from __future__ import annotations

import io

import av
import pytest
import torch

from tests.helpers import safetensors_bytes, smooth_latents
from tests.helpers.server import StartServer

LATENTS = smooth_latents(frames=3)  # 9 frames, 0.5625 s at 16 fps


def with_audio(audio: torch.Tensor, rate: str | None = "48000") -> bytes:
    metadata = {"audio_sample_rate": rate} if rate is not None else None
    return safetensors_bytes(metadata=metadata, latents=LATENTS, audio=audio)


async def test_a_soundtrack_is_streamed_in_sync_with_the_video(start_server: StartServer):
    server = await start_server()
    tone = torch.sin(torch.arange(48_000) / 48_000 * 2 * torch.pi * 440).repeat(2, 1) * 0.5
    async with server.client.post("/v1/videos/stream", data=with_audio(tone)) as response:
        assert response.headers["Content-Type"].endswith('codecs="avc1.42C00A, mp4a.40.2"')
        job_id = response.headers["X-Video-Id"]
        data = await response.read()
    with av.open(io.BytesIO(data)) as container:
        video = list(container.decode(video=0))
    with av.open(io.BytesIO(data)) as container:
        audio = list(container.decode(audio=0))
    assert len(video) == 9
    audio_seconds = sum(frame.samples for frame in audio) / 48_000
    assert abs(audio_seconds - 9 / 16) <= 1024 / 48_000  # trimmed to the video, +-1 AAC frame
    assert audio[0].layout.nb_channels == 2
    async with server.client.get(f"/v1/videos/{job_id}") as response:
        assert (await response.json())["audio"] == {"sample_rate": 48_000, "channels": 2}


async def test_the_rate_can_come_as_a_parameter(start_server: StartServer):
    server = await start_server()
    body = with_audio(torch.zeros(16_000), rate=None)
    async with server.client.post("/v1/videos?audio_sample_rate=16000", data=body) as response:
        assert response.status == 201
        assert (await response.json())["audio"] == {"sample_rate": 16_000, "channels": 1}


BAD_AUDIO = [
    (
        with_audio(torch.zeros(2, 100, 2)),
        "audio must be (channels, samples) or (samples,), got shape (2, 100, 2)",
    ),
    (with_audio(torch.full((2, 100), float("nan"))), "audio contains NaN or infinite values"),
    (
        with_audio(torch.zeros(2, 100), rate="8000"),
        "audio_sample_rate must be an integer from 16000 to 48000 Hz, got '8000'",
    ),
    (
        with_audio(torch.zeros(3, 100)),
        "audio must be mono or stereo, got 3 channels "
        "(is it (samples, channels)? send (channels, samples))",
    ),
    (
        with_audio(torch.zeros(2, 100), rate=None),
        "audio needs its sample rate: metadata or parameter 'audio_sample_rate'",
    ),
    (with_audio(torch.zeros(2, 100, dtype=torch.int16)), "audio must be floating point, got int16"),
    (with_audio(torch.zeros(2, 0)), "audio has no samples"),
]


@pytest.mark.parametrize(("body", "message"), BAD_AUDIO)
async def test_bad_audio_is_422_before_any_decode(start_server: StartServer, body, message):
    server = await start_server()
    async with server.client.post("/v1/videos", data=body) as response:
        assert response.status == 422
        assert (await response.json())["error"]["message"] == message
    assert server.manager.jobs == {}


async def test_audio_latents_need_a_model_with_a_sound_decoder(start_server: StartServer):
    """The tests' default model decodes no audio latents: a 422 that says what would."""
    server = await start_server()
    body = safetensors_bytes(latents=LATENTS, audio_latents=torch.zeros(1, 8, 4, 16))
    async with server.client.post("/v1/videos", data=body) as response:
        assert response.status == 422
        message = (await response.json())["error"]["message"]
    assert message.startswith("model 'linear' decodes no audio_latents here: it has no sound")
    assert "serve LTX-2 from its pipeline's folder" in message
    both = safetensors_bytes(
        metadata={"audio_sample_rate": "16000"},
        latents=LATENTS,
        audio=torch.zeros(2, 100),
        audio_latents=torch.zeros(1, 8, 4, 16),
    )
    async with server.client.post("/v1/videos", data=both) as response:
        assert response.status == 422
        assert (await response.json())["error"]["message"] == (
            "send 'audio' (a waveform) or 'audio_latents' (the model decodes them), not both"
        )
    assert server.manager.jobs == {}
