"""SkyReels-V2 diffusion forcing, watched while it is generated.

`SkyReelsV2DiffusionForcingPipeline` denoises causal blocks of latent frames on
staggered schedules (`ar_step`, `causal_block_size`): a block is final several rows
before the blocks after it. A long video goes in windows of `base_num_frames`, each
after the first starting from the last `overlap_history` frames of the one before.
`stream_autoregressive` pushes each latent frame from the pipeline's
`callback_on_step_end` the moment its last denoising step is done, once: the overlap a
later window starts from went with the window before. When a frame is final comes from
the pipeline's own schedule, replicated (`forcing_schedule`) and checked as the
pipeline runs.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vaecast.client import DEFAULT_TIMEOUT_S, PushSession
from vaecast.integrations.calls import (
    DIFFUSERS_REQUIREMENT,
    Job,
    PipelineCall,
    PipelineError,
    check_internals,
    internals_error,
    model_for,
    require_pipeline,
    run_latent,
)
from vaecast.integrations.pushes import (
    LazyPushSession,
    OnJob,
    frame_digests,
    with_step_callback,
)

SKYREELS_DF = "SkyReelsV2DiffusionForcingPipeline"
# What the callbacks use of a pipeline beyond its call arguments.
SKYREELS_ATTRIBUTES = ("generate_timestep_matrix", "vae_scale_factor_temporal", "scheduler")
SKYREELS_MATRIX_PARAMETERS = (
    "num_latent_frames",
    "step_template",
    "base_num_latent_frames",
    "ar_step",
    "num_pre_ready",
    "causal_block_size",
)
SKYREELS_CALL_PARAMETERS = (
    "num_frames",
    "num_inference_steps",
    "base_num_frames",
    "overlap_history",
    "ar_step",
    "causal_block_size",
    "fps",
    "callback_on_step_end",
    "callback_on_step_end_tensor_inputs",
)


@dataclass(frozen=True)
class ForcingWindow:
    """One pass of the pipeline's denoising loop (a window of a long video)."""

    latent_frames: int  # the latents this pass denoises
    first_kept: int  # its first frame the video keeps; those before are the overlap
    step_matrix: torch.Tensor  # (rows, frames): each frame's timestep at each row
    final_row: tuple[int, ...]  # per frame: the row after which it no longer changes

    @property
    def rows(self) -> int:
        return int(self.step_matrix.shape[0])


def forcing_schedule(pipe: Any, **pipe_kwargs: Any) -> list[ForcingWindow]:
    """When each latent frame of `pipe(**pipe_kwargs)` is final, from the pipeline's source.

    The loop is `SkyReelsV2DiffusionForcingPipeline.__call__`'s: `num_frames` rounded
    to 4k + 1; a long video (`overlap_history` set and `num_frames > base_num_frames`)
    in windows of `base_num_frames`, each after the first starting from the last
    `overlap_history` latent frames of the one before (cut to whole causal blocks) and
    keeping only its frames past them; in each window the rows of
    `generate_timestep_matrix` (the pipeline's own method, called with the arguments the
    pipeline gives it), where frame f is updated at row r iff `step_update_mask[r, f]`.
    A frame no row updates (a prefix frame, or one past the last whole causal block)
    never changes.
    """
    require_pipeline(pipe, SKYREELS_DF, "forcing_schedule")
    missing = check_internals(pipe, SKYREELS_ATTRIBUTES, SKYREELS_CALL_PARAMETERS)
    if not missing:
        parameters = inspect.signature(pipe.generate_timestep_matrix).parameters
        missing = [
            f"generate_timestep_matrix({name})"
            for name in SKYREELS_MATRIX_PARAMETERS
            if name not in parameters
        ]
    if missing:
        raise internals_error(pipe, missing)
    call = PipelineCall.of(pipe, pipe_kwargs)
    scale = int(pipe.vae_scale_factor_temporal)
    num_frames = int(call.arguments["num_frames"])
    if num_frames % scale != 1:
        num_frames = num_frames // scale * scale + 1
    num_frames = max(num_frames, 1)
    causal_block_size = call.arguments["causal_block_size"]
    if causal_block_size is None:
        causal_block_size = pipe.transformer.config.num_frame_per_block
    ar_step = call.arguments["ar_step"]
    base_num_frames, overlap_history = (
        call.arguments["base_num_frames"],
        call.arguments["overlap_history"],
    )
    scheduler = copy.deepcopy(pipe.scheduler)
    scheduler.set_timesteps(call.arguments["num_inference_steps"], device="cpu")
    timesteps = scheduler.timesteps
    latent_frames = (num_frames - 1) // scale + 1
    long_video = (
        overlap_history is not None and base_num_frames is not None and num_frames > base_num_frames
    )
    if long_video:
        overlap = (overlap_history - 1) // scale + 1
        base = (base_num_frames - 1) // scale + 1
        windows = 1 + (latent_frames - base - 1) // (base - overlap) + 1
    else:
        overlap, base, windows = 0, latent_frames, 1
    schedule = []
    for window in range(windows):
        if window == 0:
            frames, prefix = base, 0
        else:
            prefix = overlap - overlap % causal_block_size
            finished = window * (base - overlap) + overlap
            frames = min(latent_frames - finished + overlap, base)
        matrix, _, mask, _ = pipe.generate_timestep_matrix(
            frames,
            timesteps,
            frames if long_video else base,
            ar_step,
            prefix,
            causal_block_size,
        )
        final_row = []
        for frame in range(frames):
            rows = mask[:, frame].nonzero() if frame < mask.shape[1] else []
            final_row.append(int(rows[-1]) if len(rows) else -1)
        schedule.append(
            ForcingWindow(frames, overlap if window else 0, matrix.cpu(), tuple(final_row))
        )
    return schedule


class ForcingPusher:
    """Follows the pipeline's rows through the schedule; pushes each frame once final."""

    def __init__(self, schedule: list[ForcingWindow], push: Callable[[torch.Tensor], None]):
        self.schedule = schedule
        self._push = push
        self.window = 0
        self.row = 0
        self.next_frame = schedule[0].first_kept  # in the window's frames
        self.digests: list[bytes] = []

    def __call__(self, pipe: Any, step: int, timestep: Any, latents: torch.Tensor) -> None:
        if self.window >= len(self.schedule):
            raise PipelineError("the pipeline ran more denoising windows than its schedule has")
        window = self.schedule[self.window]
        expected = window.step_matrix[self.row]
        if (
            step != self.row
            or not isinstance(timestep, torch.Tensor)
            or timestep.shape != expected.shape
            or not torch.equal(timestep.detach().cpu().long(), expected)
            or latents.shape[2] != window.latent_frames
        ):
            raise PipelineError(
                f"the pipeline's denoising row {step} (window {self.window}) is not the one "
                f"vaecast's replica of its schedule expects (row {self.row}); this "
                f"integration follows {DIFFUSERS_REQUIREMENT}"
            )
        end = self.next_frame
        while end < window.latent_frames and window.final_row[end] <= step:
            end += 1
        if end > self.next_frame:
            block = latents[:, :, self.next_frame : end].detach().to("cpu").contiguous()
            self.digests += frame_digests(block)
            self._push(block)
            self.next_frame = end
        self.row += 1
        if self.row == window.rows:
            self.window, self.row = self.window + 1, 0
            if self.window < len(self.schedule):
                self.next_frame = self.schedule[self.window].first_kept

    def check(self, latents: torch.Tensor) -> None:
        """Every frame of the pipeline's result was pushed once, as it is there."""
        if self.window != len(self.schedule):
            raise PipelineError(
                f"the pipeline ran {self.window} of the {len(self.schedule)} denoising "
                f"windows its schedule has"
            )
        final = frame_digests(latents)
        if final != self.digests:
            changed = next(
                (i for i, (a, b) in enumerate(zip(final, self.digests, strict=False)) if a != b),
                min(len(final), len(self.digests)),
            )
            raise PipelineError(
                f"the pipeline's latents differ from those pushed from latent frame "
                f"{changed} on ({len(self.digests)} pushed, {len(final)} made): its "
                f"schedule is not the one vaecast replicates ({DIFFUSERS_REQUIREMENT})"
            )


def stream_autoregressive(
    pipe: Any,
    url: str,
    *,
    model: str | None = None,
    api_key: str | None = None,
    on_job: OnJob | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    **pipe_kwargs: Any,
) -> Job | list[Job]:
    """Run a `SkyReelsV2DiffusionForcingPipeline`, pushing each latent frame to the
    server at `url` as soon as it is final (see the module docstring); the job object
    once the last block is in (the server may still be decoding it), or for a batch
    (`num_videos_per_prompt`, several prompts) the jobs of its videos, in order.

    The video's frame rate is the pipeline's own `fps` argument (24 by default), which
    the model is conditioned on too. `on_job(job)` is called for each video when the
    session opens, with the first block (`job["urls"]["content"]` is what a viewer
    opens). A `callback_on_step_end` of the caller's runs first at each step; the
    latents it returns, if any, are the ones pushed.
    """
    require_pipeline(pipe, SKYREELS_DF, "stream_autoregressive")
    schedule = forcing_schedule(pipe, **pipe_kwargs)
    call = PipelineCall.of(pipe, pipe_kwargs)
    model = model or model_for(pipe)

    def open_session(batch: int) -> PushSession:
        fps = call.arguments["fps"]
        return PushSession(url, fps=fps, model=model, api_key=api_key, timeout=timeout, batch=batch)

    with contextlib.ExitStack() as stack:
        pushes = LazyPushSession(stack, open_session, on_job, api_key)
        pusher = ForcingPusher(schedule, pushes.push)
        latents = run_latent(pipe, with_step_callback(pipe_kwargs, pusher))
        pusher.check(latents)
    return pushes.jobs()
