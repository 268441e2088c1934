"""HunyuanVideo FramePack, section by section.

`HunyuanVideoFramepackPipeline` with `sampling_type="vanilla"` makes its video in
sections, in the order they play. Its sections are decoded here, not by the server:
FramePack decodes each section's latents on their own (with the section before as
context) and cross-fades the decoded videos over `(latent_window_size - 1) * 4 + 1`
frames, which no single decode of the joined latents gives. So `stream_sections` runs
the pipeline's own decode step on the producer's device, from the step callback at
each section's last step, and pushes frames (`PushSession(kind="frames")`), bit for
bit the pipeline's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from vaecast.client import DEFAULT_TIMEOUT_S, Fps, PushSession
from vaecast.integrations.calls import (
    DIFFUSERS_REQUIREMENT,
    Job,
    PipelineCall,
    PipelineError,
    check_internals,
    internals_error,
    require_pipeline,
    run_latent,
)
from vaecast.integrations.pushes import LazyPushSession, OnJob, with_step_callback

FRAMEPACK = "HunyuanVideoFramepackPipeline"
FRAMEPACK_FPS = 30
FRAMEPACK_VANILLA = "vanilla"
# What the decode step uses of a pipeline beyond its call arguments.
FRAMEPACK_ATTRIBUTES = (
    "prepare_image_latents",
    "_soft_append",
    "num_timesteps",
    "vae_scale_factor_temporal",
    "video_processor",
)
FRAMEPACK_CALL_PARAMETERS = (
    "latent_window_size",
    "sampling_type",
    "callback_on_step_end",
    "callback_on_step_end_tensor_inputs",
)


class SectionPusher:
    """FramePack's vanilla decode step, as `HunyuanVideoFramepackPipeline.__call__`
    writes it for output types other than latent, run from the callback at each
    section's last step; the frames no later section blends into are pushed."""

    def __init__(self, pipe: Any, window: int, push: Callable[[torch.Tensor], None]):
        self.pipe = pipe
        self.window = window  # latent frames per section
        self.overlap = (window - 1) * int(pipe.vae_scale_factor_temporal) + 1
        self._push = push
        self.image_latents: torch.Tensor | None = None
        self.previous: torch.Tensor | None = None  # the last section's latents
        self.tail: torch.Tensor | None = None  # decoded frames a later section may blend
        self.sections = 0
        self.frames_pushed = 0

    def prepare_image_latents(self, original: Callable[..., torch.Tensor]) -> Callable[..., Any]:
        def capture(*args: Any, **kwargs: Any) -> torch.Tensor:
            self.image_latents = original(*args, **kwargs)
            return self.image_latents

        return capture

    def __call__(self, pipe: Any, step: int, timestep: Any, latents: torch.Tensor) -> None:
        if step != pipe.num_timesteps - 1:
            return
        vae = pipe.vae
        if self.previous is None:
            if self.image_latents is None:
                raise PipelineError("FramePack's image latents were never prepared")
            history = torch.cat([self.image_latents, latents], dim=2)
        else:
            history = torch.cat([self.previous, latents], dim=2)[:, :, -2 * self.window :]
        current = history.to(vae.dtype) / vae.config.scaling_factor
        video = vae.decode(current, return_dict=False)[0]
        if self.tail is not None:
            video = pipe._soft_append(self.tail, video, self.overlap)
        self.previous = latents
        self.sections += 1
        final = video.shape[2] - self.overlap
        if final > 0:
            self._publish(video[:, :, :final])
        self.tail = video[:, :, max(final, 0) :]

    def finish(self, output: Any) -> None:
        """Push the last section's tail, cut as the pipeline cuts its video."""
        if self.tail is None or not isinstance(output, list) or len(output) != self.sections:
            raise PipelineError(
                f"FramePack made {len(output) if isinstance(output, list) else '?'} sections; "
                f"vaecast decoded {self.sections} ({DIFFUSERS_REQUIREMENT})"
            )
        scale = int(self.pipe.vae_scale_factor_temporal)
        frames = self.frames_pushed + self.tail.shape[2]
        kept = (frames - 1) // scale * scale + 1
        tail = self.tail[:, :, : kept - self.frames_pushed]
        if tail.shape[2] > 0:
            self._publish(tail)

    def _publish(self, video: torch.Tensor) -> None:
        # The pipeline's own postprocessing of its decoded video, to [0, 1].
        frames = self.pipe.video_processor.postprocess_video(video, output_type="pt")
        self._push(frames.permute(0, 2, 1, 3, 4).contiguous())
        self.frames_pushed += video.shape[2]


def stream_sections(
    pipe: Any,
    url: str,
    *,
    fps: Fps = FRAMEPACK_FPS,
    api_key: str | None = None,
    on_job: OnJob | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    **pipe_kwargs: Any,
) -> Job | list[Job]:
    """Run a `HunyuanVideoFramepackPipeline` with `sampling_type="vanilla"`, pushing
    each section's frames to the server at `url` as it is made (see the module
    docstring); the job object once the last frames are in (a batch's jobs, in order).

    The frames are the pipeline's own output (`output_type="np"`), decoded here on the
    pipeline's device: each section's frames but the last `(latent_window_size - 1) * 4
    + 1`, which the next section cross-fades, go as soon as the section is decoded.
    `on_job` and a caller's `callback_on_step_end` are as for `stream_autoregressive`.
    """
    require_pipeline(pipe, FRAMEPACK, "stream_sections")
    missing = check_internals(pipe, FRAMEPACK_ATTRIBUTES, FRAMEPACK_CALL_PARAMETERS)
    if missing:
        raise internals_error(pipe, missing)
    call = PipelineCall.of(pipe, pipe_kwargs)
    sampling = call.arguments["sampling_type"]
    if str(getattr(sampling, "value", sampling)) != FRAMEPACK_VANILLA:
        raise PipelineError(
            f"FramePack's {getattr(sampling, 'value', sampling)!r} sampling makes its sections "
            f"last first; only sampling_type='vanilla' makes them in the order they play"
        )

    def open_session(batch: int) -> PushSession:
        return PushSession(
            url, kind="frames", fps=fps, api_key=api_key, timeout=timeout, batch=batch
        )

    with contextlib.ExitStack() as stack:
        pushes = LazyPushSession(stack, open_session, on_job, api_key)
        pusher = SectionPusher(pipe, int(call.arguments["latent_window_size"]), pushes.push)
        # Its image latents come from the generator, before any section: the first
        # section's decode needs them, and the pipeline shows them to no callback.
        pipe.prepare_image_latents = pusher.prepare_image_latents(pipe.prepare_image_latents)
        stack.callback(vars(pipe).pop, "prepare_image_latents", None)
        output = run_latent(pipe, with_step_callback(pipe_kwargs, pusher))
        pusher.finish(output)
    return pushes.jobs()
