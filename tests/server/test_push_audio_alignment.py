"""Push sessions with audio through a real server: each fragment carries the audio of
its own video span, read back from its `tfdt`/`trun` boxes; no fragment is audio-only."""

from __future__ import annotations

import asyncio
import io
import re
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from tests.helpers import safetensors_bytes, smooth_latents
from tests.helpers.fragment_audio import Timeline, assert_aligned
from tests.helpers.server import Server, StartServer
from vaecast.cli.push_file import push_file
from vaecast.client import PushSession
from vaecast.codecs.aac import AAC_FRAME_SAMPLES, samples_for_duration
from vaecast.job.views import job_object
from vaecast.server.stream.job import Job

QUIET_S = 0.3  # how long a fragment that must wait is watched not coming


def video_frames(latent_frames: int) -> int:
    return 0 if latent_frames == 0 else 1 + 4 * (latent_frames - 1)  # the linear decoder


class Producer:
    """A push session's producer: latent blocks, each with its span of a tone."""

    def __init__(self, server: Server, fps: int, rate: int, latent_frames: int) -> None:
        self.server, self.fps, self.rate = server, fps, rate
        self.latents = smooth_latents(latent_frames)
        self.pushed = 0
        self.session: dict = {}
        self.sound = tone(self.sample(video_frames(latent_frames)), rate)

    def sample(self, frame: int) -> int:
        return samples_for_duration(Fraction(frame, self.fps), self.rate)

    async def open(self) -> Producer:
        fields = {"input": "push", "fps": self.fps, "audio_sample_rate": self.rate}
        async with self.server.client.post("/v1/videos", json=fields) as response:
            assert response.status == 201, await response.text()
            self.session = await response.json()
        return self

    @property
    def job(self) -> Job:
        return self.server.manager.get(self.session["id"])

    async def push(self, count: int, audio: bool = True, final: bool = False) -> None:
        first, last = video_frames(self.pushed), video_frames(self.pushed + count)
        tensors = {"latents": self.latents[:, :, self.pushed : self.pushed + count].contiguous()}
        if audio:
            span = self.sound[self.sample(first) : self.sample(last)]
            tensors["audio"] = torch.from_numpy(span).unsqueeze(0)
        await self._post(safetensors_bytes({"audio_sample_rate": str(self.rate)}, **tensors), final)
        self.pushed += count

    async def end(self) -> None:
        await self._post(b"", final=True)

    async def _post(self, body: bytes, final: bool) -> None:
        async with self.server.client.post(
            self.session["push"]["url"],
            data=body,
            headers={"X-Push-Token": self.session["push"]["token"]},
            params={"final": "1"} if final else {},
        ) as response:
            assert response.status == 202, await response.text()

    async def content(self) -> bytes:
        await asyncio.wait_for(self.job.wait(), 60)
        assert job_object(self.job.record)["status"] == "completed", job_object(self.job.record)[
            "error"
        ]
        async with self.server.client.get(self.session["urls"]["content"]) as response:
            return await response.read()

    async def quiet(self, chunks: int) -> None:
        await asyncio.sleep(QUIET_S)
        assert self.job.record.chunks_done == chunks


def tone(samples: int, rate: int) -> np.ndarray:
    t = np.arange(samples) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def heard(data: bytes) -> tuple[np.ndarray, int]:
    """The audio as FFmpeg decodes it (first channel) and its rate."""
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    samples = np.concatenate([f.to_ndarray().reshape(f.layout.nb_channels, -1)[0] for f in frames])
    return samples, frames[0].sample_rate


def loudness(audio: np.ndarray, start: int, stop: int) -> float:
    """RMS over [start, stop), an AAC frame in from each end (the codec's overlap)."""
    return float(np.sqrt(np.mean(audio[start + AAC_FRAME_SAMPLES : stop - AAC_FRAME_SAMPLES] ** 2)))


def assert_whole(line: Timeline, chunks: int, video_end: int) -> None:
    assert len(line.spans) == chunks  # one fragment per chunk: none audio-only after them
    assert line.spans[-1].video is not None and line.spans[-1].video[1] == video_end


@pytest.mark.parametrize(
    ("rate", "fps", "blocks"),
    [
        (16_000, 8, (1, 1, 2, 1, 1)),  # 2000 samples a frame
        (48_000, 16, (2, 2, 2)),  # 3000
        (16_000, 16, (1, 1, 1, 1, 1, 1)),  # 1000, under an AAC frame: Wan S2V's rates
    ],
)
async def test_each_fragment_of_a_push_carries_its_own_audio(
    start_server: StartServer, rate: int, fps: int, blocks: tuple[int, ...]
):
    server = await start_server()
    producer = await Producer(server, fps, rate, sum(blocks)).open()
    for index, count in enumerate(blocks):
        await producer.push(count, final=index == len(blocks) - 1)
    data = await producer.content()
    end = producer.sample(video_frames(sum(blocks)))
    line = assert_aligned(data)
    assert_whole(line, sum(blocks), end)
    # The first fragment plays with its sound from 0, past its one video frame.
    assert line.spans[0].audio is not None and line.spans[0].audio[0] == 0
    audio, decoded_rate = heard(data)
    assert decoded_rate == rate and abs(len(audio) - end) < AAC_FRAME_SAMPLES
    assert loudness(audio, 0, end) > 0.15  # the tone throughout, no silence spliced in


async def test_a_block_without_its_audio_is_silence_and_the_fragments_stay_aligned(
    start_server: StartServer,
):
    server = await start_server()
    producer = await Producer(server, 8, 16_000, 6).open()
    for index in range(6):
        await producer.push(1, audio=index != 2)  # latent frame 2: video frames 5-8
    await producer.end()
    data = await producer.content()
    line = assert_aligned(data)
    assert_whole(line, 6, producer.sample(21))
    audio, _ = heard(data)
    gap = producer.sample(5), producer.sample(9)
    assert loudness(audio, *gap) < 0.01
    assert loudness(audio, 0, gap[0]) > 0.15 and loudness(audio, gap[1], len(audio)) > 0.15


async def test_a_fragment_waits_for_the_next_blocks_audio_and_the_last_for_the_end(
    start_server: StartServer,
):
    server = await start_server()
    producer = await Producer(server, 8, 16_000, 3).open()
    for chunks in range(3):
        await producer.push(1)
        await producer.quiet(chunks)  # this block's chunk waits for the next block
    await producer.end()  # the last chunk's fragment: the rest of the audio, then done
    data = await producer.content()
    assert_whole(assert_aligned(data), 3, producer.sample(9))
    latencies = [e["latency_s"] for e in producer.job.events.items() if e["event"] == "chunk"]
    assert len(latencies) == 3 and all(latency >= QUIET_S / 2 for latency in latencies)


async def test_without_audio_a_fragment_does_not_wait_for_the_next_block(
    start_server: StartServer,
):
    server = await start_server()
    producer = Producer(server, 8, 16_000, 3)
    async with server.client.post("/v1/videos", json={"input": "push", "fps": 8}) as response:
        producer.session = await response.json()
    for chunks in range(1, 4):
        await producer.push(1, audio=False)
        await asyncio.wait_for(_until_chunks(producer.job, chunks), 30)
    await producer.end()
    await producer.content()


async def _until_chunks(job: Job, chunks: int) -> None:
    while job.record.chunks_done < chunks:  # noqa: ASYNC110 - the job offers no event for it
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("how", ["idle timeout", "delete"])
async def test_a_session_that_ends_while_a_fragment_waits_for_audio_ends_at_once(
    start_server: StartServer, how: str
):
    server = await start_server(push_idle_timeout_s=0.5 if how == "idle timeout" else 60.0)
    producer = await Producer(server, 8, 16_000, 2).open()
    await producer.push(1)
    await producer.quiet(0)
    if how == "delete":
        async with server.client.delete(f"/v1/videos/{producer.session['id']}") as response:
            assert response.status == 200
    await asyncio.wait_for(producer.job.wait(), 10)
    expected = "failed" if how == "idle timeout" else "cancelled"
    assert job_object(producer.job.record)["status"] == expected


@pytest.mark.parametrize("soundtrack_frames", [21, 11])  # the whole video; half of it
async def test_vaecast_push_of_a_file_with_a_soundtrack_is_aligned(
    start_server: StartServer, tmp_path: Path, soundtrack_frames: int
):
    server = await start_server()
    rate, fps = 16_000, 8
    sound = tone(soundtrack_frames * rate // fps, rate)
    path = tmp_path / "z.safetensors"
    metadata = {"fps": str(fps), "audio_sample_rate": str(rate)}
    path.write_bytes(
        safetensors_bytes(
            metadata, latents=smooth_latents(6), audio=torch.from_numpy(sound).unsqueeze(0)
        )
    )
    out = io.StringIO()
    status = await asyncio.to_thread(
        push_file, path, server.url, latent_fps=0, block_frames=2, out=out
    )
    assert status == 0, out.getvalue()
    match = re.search(r"/v1/videos/([^/]+)/content", out.getvalue())
    assert match is not None, out.getvalue()
    job = server.manager.get(match.group(1))
    await asyncio.wait_for(job.wait(), 60)
    assert job_object(job.record)["status"] == "completed", job_object(job.record)["error"]
    async with server.client.get(f"/v1/videos/{job.id}/content") as response:
        data = await response.read()
    line = assert_aligned(data)
    assert_whole(line, 6, 21 * rate // fps)
    audio, _ = heard(data)
    end_of_sound = soundtrack_frames * rate // fps
    assert loudness(audio, 0, end_of_sound) > 0.15
    if soundtrack_frames < 21:  # the later blocks came without audio: silence
        assert loudness(audio, end_of_sound, len(audio)) < 0.01


@pytest.mark.parametrize("blocks", [(5, 4, 4, 8), (1, 1, 3)])
async def test_each_fragment_of_a_frames_push_carries_its_own_audio(
    start_server: StartServer, blocks: tuple[int, ...]
):
    """A producer that decodes itself pushes frames with their audio, through the client:
    the fragments are aligned as a latent push's are."""
    server = await start_server()
    rate, fps = 16_000, 8
    frames = sum(blocks)
    sound = tone(samples_for_duration(Fraction(frames, fps), rate), rate)
    session = PushSession(server.url, kind="frames", fps=fps, audio_sample_rate=rate)
    await asyncio.to_thread(session.open)
    pixels = (np.arange(frames * 48 * 64 * 3) % 251).astype(np.uint8).reshape(frames, 48, 64, 3)
    pushed = 0
    for index, count in enumerate(blocks):
        span = sound[
            samples_for_duration(Fraction(pushed, fps), rate) : samples_for_duration(
                Fraction(pushed + count, fps), rate
            )
        ]
        await asyncio.to_thread(
            session.push,
            pixels[pushed : pushed + count],
            span[np.newaxis],
            final=index == len(blocks) - 1,
        )
        pushed += count
    await asyncio.to_thread(session.close)
    job = server.manager.get(session.id)
    await asyncio.wait_for(job.wait(), 60)
    assert job_object(job.record)["status"] == "completed", job_object(job.record)["error"]
    async with server.client.get(session.content_url.removeprefix(server.url)) as response:
        data = await response.read()
    end = samples_for_duration(Fraction(frames, fps), rate)
    line = assert_aligned(data)
    assert_whole(line, job.record.chunks_done, end)  # the frames decoder's chunks: a frame each
    assert sum(span.video_frames for span in line.spans) == frames
    assert line.spans[0].audio is not None and line.spans[0].audio[0] == 0
    audio, _ = heard(data)
    assert abs(len(audio) - end) < AAC_FRAME_SAMPLES
    assert loudness(audio, 0, end) > 0.15


async def test_a_pushed_block_of_audio_latents_is_refused_with_where_they_go(
    start_server: StartServer,
):
    server = await start_server()
    producer = await Producer(server, 16, 16_000, 2).open()
    body = safetensors_bytes(
        latents=producer.latents[:, :, :1].contiguous(), audio_latents=torch.zeros(1, 8, 4, 16)
    )
    async with server.client.post(
        producer.session["push"]["url"],
        data=body,
        headers={"X-Push-Token": producer.session["push"]["token"]},
    ) as response:
        assert response.status == 422
        assert (await response.json())["error"]["message"] == (
            "a pushed block takes 'audio' (its waveform), not audio_latents: upload the whole "
            "clip's audio latents with its latents (POST /v1/videos)"
        )
