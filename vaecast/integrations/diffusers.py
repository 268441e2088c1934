"""diffusers video pipelines, end to end into a vaecast server.

    job = stream(pipe, "http://127.0.0.1:8000", prompt="...", num_frames=81)
    print("watch:", "http://127.0.0.1:8000" + job["urls"]["content"])

Four ways in, by how the pipeline makes its video:

- `stream(pipe, url, **pipe_kwargs)`: any pipeline whose VAE vaecast decodes (Wan 2.1
  and 2.2, HunyuanVideo and 1.5, LTX-Video, LTX-2, CogVideoX, Mochi, SkyReels-V2). The
  pipeline runs once with `output_type="latent"`; its latents go up unchanged
  (`POST /v1/videos`): the server converts the pipeline's own layout (LTX's packed
  tokens, CogVideoX's BTCHW; `vaecast.models.layouts`) and decodes them, as the pipeline
  would, into a progressive MP4 that viewers watch while it is decoded. The model is
  the one the server names for the VAE's class (`DIFFUSERS_CLASSES`; Wan 2.2 by its 48
  latent channels); the call's `num_frames`, `height` and `width` go with it, since
  packed tokens do not carry them.
- `stream_autoregressive(pipe, url, **pipe_kwargs)` (`vaecast.integrations.skyreels`):
  `SkyReelsV2DiffusionForcingPipeline`, watched while it is generated, each latent frame
  pushed from the step callback the moment its last denoising step is done.
- `stream_sections(pipe, url, **pipe_kwargs)` (`vaecast.integrations.framepack`):
  `HunyuanVideoFramepackPipeline` with `sampling_type="vanilla"`, each section's frames
  decoded by the pipeline's own decode step and pushed as the section is made.
- `stream_decoded(pipe, url, **pipe_kwargs)`: the self-decoding shape for any pipeline
  of the first kind: the producer decodes on its own device with vaecast's decoder for
  its VAE (the same chunks the server would make) and pushes each chunk's frames as it
  is decoded; the server only encodes and serves.

Batches: a call that makes several videos (`num_videos_per_prompt`, a list of prompts,
batched `prompt_embeds`) makes a job per video, returned as a list in the batch's order
(one video: its job alone). `stream` uploads the batch at once (the server answers
`{"data": [job, ...]}`); the push ways open a batch push session
(`PushSession(batch=B)`), every block holding all B videos; `stream_decoded` decodes and
pushes one video after the other. A batch push waits for room in every video's block
queue, and a video that waits for a decode slot frees none: serve a batch with
`--push-queue-blocks` at least a video's pushes (SkyReels-V2: one per causal block), or
its first video times out. Every call runs the pipeline with `output_type="latent"`, so
it neither decodes twice nor takes another `output_type`.

The diffusion-forcing schedule and FramePack's decode step are the pipelines' source,
replicated: diffusers 0.42's (`DIFFUSERS_REQUIREMENT`). What of a pipeline they use is
checked before it runs (`PipelineError` names what is missing), and while it runs each
denoising row's timesteps are checked against the replicated schedule, and at the end
every pushed latent frame against the pipeline's result: an upgrade that changes the
schedule fails loudly (the job is cancelled) rather than streaming frames that are not
final. Pushes are synchronous in the callback: the pipeline waits while the server's
block queue is full, as far as its decoder is behind.

A push session fails when it receives nothing for the server's `--push-idle-timeout`
(60 s by default): the session opens with the first block, but within a run the gap
between two pushes is as long as a block takes to finish (for SkyReels-V2 up to
`num_inference_steps` transformer steps at the start of each window of a long video;
for FramePack a section), so a real model on a slow device needs a longer timeout.

HTTP goes through `vaecast.client` (push sessions) and `urllib` (uploads), the body as
safetensors; nothing here imports diffusers itself.
"""

from __future__ import annotations

import math
from typing import Any

from vaecast.client import DEFAULT_TIMEOUT_S, Fps, PushSession
from vaecast.integrations.calls import (
    DEFAULT_FPS,
    DIFFUSERS_REQUIREMENT,
    Job,
    PipelineCall,
    PipelineError,
    class_names,
    latent_tensor,
    model_for,
    run_latent,
    with_fps,
)
from vaecast.integrations.framepack import FRAMEPACK, FRAMEPACK_FPS, stream_sections
from vaecast.integrations.pushes import OnJob, UploadError, one_or_all, upload
from vaecast.integrations.skyreels import (
    SKYREELS_DF,
    ForcingWindow,
    forcing_schedule,
    stream_autoregressive,
)
from vaecast.models.base import ChunkedDecoder
from vaecast.models.layouts import layout_of
from vaecast.models.registry import decoder_class

__all__ = [
    "DEFAULT_FPS",
    "DIFFUSERS_REQUIREMENT",
    "FRAMEPACK",
    "FRAMEPACK_FPS",
    "SKYREELS_DF",
    "ForcingWindow",
    "PipelineError",
    "UploadError",
    "forcing_schedule",
    "model_for",
    "stream",
    "stream_autoregressive",
    "stream_decoded",
    "stream_sections",
    "upload",
]


def stream(
    pipe: Any,
    url: str,
    *,
    fps: Fps | None = None,
    model: str | None = None,
    api_key: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    **pipe_kwargs: Any,
) -> Job | list[Job]:
    """Run `pipe(**pipe_kwargs)` for its latents and upload them to the server at `url`;
    the job object it answers (`id`, `status`, `urls`: `content` is the MP4, progressive
    while it is decoded), or for a batch the list of its videos' jobs.

    `fps`: the video's frame rate; by default the call's own (LTX's `frame_rate`,
    SkyReels-V2's `fps`, which is then passed to the pipeline too) or the model's
    (`DEFAULT_FPS`). `model`: the server's model name, if not the one for the VAE's
    class. The pipeline is refused before it runs when vaecast does not decode its VAE.
    """
    if FRAMEPACK in class_names(pipe):
        raise PipelineError(
            "FramePack's latents are not one video's (each section is decoded on its own "
            "and cross-faded): use stream_sections"
        )
    pipe_kwargs = with_fps(pipe, pipe_kwargs, fps)
    call = PipelineCall.of(pipe, pipe_kwargs)
    model = model or model_for(pipe)
    latents = latent_tensor(pipe, run_latent(pipe, pipe_kwargs))
    query = {"model": model, "fps": str(fps if fps is not None else call.fps(model))}
    query.update(call.geometry(model))
    return upload(url, latents, query, api_key=api_key, timeout=timeout)


def stream_decoded(
    pipe: Any,
    url: str,
    *,
    fps: Fps | None = None,
    model: str | None = None,
    api_key: str | None = None,
    on_job: OnJob | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    **pipe_kwargs: Any,
) -> Job | list[Job]:
    """Run `pipe` for its latents, decode them here with vaecast's decoder for its VAE
    (on the VAE's device), and push each decoded chunk's frames to the server at `url`
    as it is decoded (`PushSession(kind="frames")`); the job object once the last is in
    (a batch's jobs, each video decoded and pushed after the one before).

    The chunks are what the server would decode from the same latents, in the decoder's
    `value_range`, quantized by the client exactly as the server quantizes its own
    (`vaecast.codecs.quantize`); `fps` and `model` are as for `stream`. `on_job(job)` is
    called as each video's session opens, before its first frames are decoded.
    """
    pipe_kwargs = with_fps(pipe, pipe_kwargs, fps)
    call = PipelineCall.of(pipe, pipe_kwargs)
    model = model or model_for(pipe)
    vae = pipe.vae
    decoder = decoder_class(model)(vae, device=vae.device)  # type: ignore[call-arg]
    latents = latent_tensor(pipe, run_latent(pipe, pipe_kwargs))
    bound = layout_of(decoder).bind(call.geometry(model))
    bound.bcthw_shape(tuple(int(d) for d in latents.shape))
    latents = bound.to_bcthw(latents)
    frame_rate = fps if fps is not None else call.fps(model)
    jobs = []
    for index in range(latents.shape[0]):
        session = PushSession(
            url,
            kind="frames",
            fps=frame_rate,
            value_range=tuple(decoder.value_range),
            api_key=api_key,
            timeout=timeout,
        )
        jobs.append(_push_decoded(decoder, latents[index : index + 1], session, on_job))
    return one_or_all(jobs)


def _push_decoded(
    decoder: ChunkedDecoder, latents: Any, session: PushSession, on_job: OnJob | None
) -> Job:
    """Decode one video's BCTHW latents, pushing each chunk's frames as it is made."""
    with session:
        if on_job is not None:
            on_job(session.job)
        # The server cuts a frames session into chunks of its first block's length, a
        # later block's rest waiting for the next: a first block of the chunks' common
        # divisor makes every later chunk go out whole, the moment it is pushed.
        unit = math.gcd(*decoder.plan(tuple(int(d) for d in latents.shape)).chunk_frames)

        def push(chunk: Any) -> None:
            # The chunk is borrowed for the callback only: each push quantizes it first.
            if chunk.index == 0 and chunk.frames.shape[2] > unit:
                session.push(chunk.frames[:, :, :unit])
                session.push(chunk.frames[:, :, unit:])
            else:
                session.push(chunk.frames)

        decoder.decode_chunks(latents, push)
    return session.refresh()
