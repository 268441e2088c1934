"""Bring your own VAE: a user's decoder, in the contract the video frameworks already use.

`--model package.module:factory` (or a name in the `vaecast.decoders` entry-point
group) names a factory that vaecast calls as `factory(device=..., weights=...)`. It
returns one of:

- a `ChunkedDecoder` of vaecast's own contract (`vaecast.models.base`), used as is;
- a *driven* decoder, vLLM-Omni's `SupportsChunkedVAEDecode`: `decode_with_chunks(z,
  on_chunk=...)` calls `on_chunk` with each committed BCTHW chunk (a tensor, or an
  object whose `frames` is one) in `chunk_value_range`;
- a MiniMax-H3-style *temporal chunk callback* decoder, `temporal_chunk_callback_api_version
  = 1`: a decode method (`decode_base`, `decode_temporal` or `decode`) that takes
  `temporal_chunk_callback=` and calls it as `callback(frames, *, chunk_index,
  total_chunks, frame_start, is_final)`; values in `chunk_value_range` (default
  [0, 1], what H3 publishes).

The two framework forms also give `plan(latent_shape)`: the frame size and the
chunking a decode of BCTHW latents of that shape will publish, as a `DecodePlan` or
`(height, width, chunk_frames)`. vaecast writes the init segment, the job's totals and
the HLS target duration before the first chunk exists, so it needs them up front.
Optional: `latent_channels` (checked before the decode), `name`.

A chunk is borrowed: the framework may reuse its buffer once the callback returns.
vaecast converts each chunk to its host YUV inside the callback, so a buffer reused
afterwards changes nothing. Every chunk is checked against the plan (index, frame
start, frame count, size, value type) before it goes on; a plugin that breaks it, or
raises, fails its job with the reason, and the server goes on. A framework decoder
decodes whole latents only: a push session needs a vaecast `ChunkedDecoder`.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vaecast.errors import InvalidRequestError, VaecastError, WeightsError
from vaecast.models.base import (
    ChunkCallback,
    ChunkedDecoder,
    DecodedChunk,
    DecodePlan,
    StreamPlan,
    check_latent_shape,
)

TEMPORAL_API_VERSION = 1
TEMPORAL_CALLBACK_METHODS = ("decode_base", "decode_temporal", "decode")
# MiniMax-H3's callback publishes frames through its processor, in [0, 1].
TEMPORAL_CALLBACK_VALUE_RANGE = (0.0, 1.0)


def build_plugin(
    name: str, factory: Callable[..., Any], device: str | torch.device, weights: Any, **options: Any
) -> ChunkedDecoder:
    """Call a plugin's factory and adapt what it returns; its errors become `WeightsError`."""
    try:
        made = factory(
            device=str(device), weights=None if weights is None else str(weights), **options
        )
    except VaecastError:
        raise
    except Exception as error:
        raise WeightsError(f"model {name!r}: its factory failed: {error!r}") from None
    return adapt(made, name, torch.device(device))


def adapt(made: Any, name: str, device: torch.device) -> ChunkedDecoder:
    """`made` as a `ChunkedDecoder`; `WeightsError` says which contract it misses."""
    if isinstance(made, ChunkedDecoder):
        return made
    plan = getattr(made, "plan", None)
    value_range = getattr(made, "chunk_value_range", None)
    if callable(getattr(made, "decode_with_chunks", None)):
        run = _driven(made)
    elif getattr(made, "temporal_chunk_callback_api_version", None) == TEMPORAL_API_VERSION:
        run = _temporal_callback(made, name)
        value_range = value_range or TEMPORAL_CALLBACK_VALUE_RANGE
    else:
        raise WeightsError(
            f"model {name!r}: its factory returned a {type(made).__name__}, which is neither a "
            f"vaecast ChunkedDecoder, nor has decode_with_chunks(z, on_chunk=...) with "
            f"chunk_value_range, nor temporal_chunk_callback_api_version = 1"
        )
    if not callable(plan):
        raise WeightsError(
            f"model {name!r}: a {type(made).__name__} needs plan(latent_shape) -> (height, "
            f"width, chunk_frames): vaecast writes the frame size and chunk count first"
        )
    try:
        low, high = (float(v) for v in value_range)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise WeightsError(
            f"model {name!r}: chunk_value_range must be (low, high), got {value_range!r}"
        ) from None
    if not low < high:
        raise WeightsError(f"model {name!r}: chunk_value_range {value_range!r} is not increasing")
    channels = getattr(made, "latent_channels", None)
    return FrameworkDecoder(
        name=str(getattr(made, "name", None) or name),
        inner=made,
        run=run,
        inner_plan=plan,
        value_range=(low, high),
        device=device,
        latent_channels=int(channels) if isinstance(channels, int) else None,
    )


Run = Callable[[torch.Tensor, Callable[[Any, dict[str, Any]], None]], None]


def _driven(made: Any) -> Run:
    def run(latents: torch.Tensor, consume: Callable[[Any, dict[str, Any]], None]) -> None:
        made.decode_with_chunks(latents, on_chunk=lambda chunk: consume(chunk, {}))

    return run


def _temporal_callback(made: Any, name: str) -> Run:
    for method_name in TEMPORAL_CALLBACK_METHODS:
        method = getattr(made, method_name, None)
        if callable(method) and "temporal_chunk_callback" in _parameters(method):
            break
    else:
        raise WeightsError(
            f"model {name!r}: temporal_chunk_callback_api_version is 1 but none of "
            f"{', '.join(TEMPORAL_CALLBACK_METHODS)} takes temporal_chunk_callback"
        )

    def run(latents: torch.Tensor, consume: Callable[[Any, dict[str, Any]], None]) -> None:
        method(latents, temporal_chunk_callback=lambda frames, **meta: consume(frames, meta))

    return run


def _parameters(method: Callable[..., Any]) -> Sequence[str]:
    try:
        return list(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return []


@dataclass(eq=False)
class FrameworkDecoder(ChunkedDecoder):
    """A framework's chunked decoder under vaecast's contract (whole latents only)."""

    name: str
    inner: Any
    run: Run
    inner_plan: Callable[[Sequence[int]], Any]
    value_range: tuple[float, float]
    device: torch.device
    latent_channels: int | None = None
    # One decode at a time per plugin instance: a framework's VAE keeps its own state
    # (caches, buffers it reuses for chunks) and was not written for concurrent calls.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def plan(self, latent_shape: Sequence[int]) -> DecodePlan:
        if self.latent_channels is not None:
            check_latent_shape(latent_shape, self.latent_channels)
        try:
            planned = self.inner_plan(tuple(int(d) for d in latent_shape))
        except VaecastError:
            raise
        except Exception as error:
            raise InvalidRequestError(
                f"model {self.name!r} cannot decode latents of shape {tuple(latent_shape)}: {error}"
            ) from None
        return _as_plan(planned, self.name)

    def plan_stream(self, first_block_shape: Sequence[int]) -> StreamPlan:
        raise InvalidRequestError(
            f"model {self.name!r} decodes whole latents only; a push session needs a "
            f"streaming decoder (a vaecast ChunkedDecoder)"
        )

    def decode_stream(self, blocks: Iterable[torch.Tensor], on_chunk: ChunkCallback) -> DecodePlan:
        raise InvalidRequestError(f"model {self.name!r} decodes whole latents only")

    def decode_chunks(self, latents: torch.Tensor, on_chunk: ChunkCallback) -> None:
        plan = self.plan(latents.shape)
        checker = _PlanChecker(plan, self.name, on_chunk)
        with self._lock, torch.inference_mode():
            self.run(latents, checker.consume)
        checker.check_complete()


def _as_plan(planned: Any, name: str) -> DecodePlan:
    if isinstance(planned, DecodePlan):
        return planned
    try:
        height, width, chunk_frames = planned
        plan = DecodePlan(int(height), int(width), tuple(int(n) for n in chunk_frames))
    except (TypeError, ValueError):
        raise WeightsError(
            f"model {name!r}: plan() must return a DecodePlan or (height, width, "
            f"chunk_frames), got {planned!r}"
        ) from None
    if plan.height < 1 or plan.width < 1 or not plan.chunk_frames or min(plan.chunk_frames) < 1:
        raise WeightsError(f"model {name!r}: plan() returned an empty video: {planned!r}")
    return plan


@dataclass(slots=True)
class _PlanChecker:
    plan: DecodePlan
    name: str
    on_chunk: ChunkCallback
    index: int = 0
    frame_start: int = 0

    def consume(self, chunk: Any, meta: dict[str, Any]) -> None:
        frames = getattr(chunk, "frames", chunk)
        plan, index = self.plan, self.index
        if not isinstance(frames, torch.Tensor) or frames.ndim != 5:
            raise RuntimeError(
                f"{self.name} published a chunk that is not a BCTHW tensor: "
                f"{type(frames).__name__} {tuple(getattr(frames, 'shape', ()))}"
            )
        if not frames.is_floating_point():
            raise RuntimeError(f"{self.name} published a chunk of {frames.dtype}, not floats")
        expected = (
            (plan.chunk_frames[index], plan.height, plan.width) if index < plan.chunks else None
        )
        got = (int(frames.shape[2]), int(frames.shape[3]), int(frames.shape[4]))
        if expected != got or frames.shape[0] != 1:
            raise RuntimeError(
                f"{self.name} broke its plan at chunk {index}: (frames, height, width) "
                f"{got}, planned {expected}"
            )
        said = (meta.get("chunk_index", index), meta.get("frame_start", self.frame_start))
        if (
            said != (index, self.frame_start)
            or meta.get("total_chunks", plan.chunks) != plan.chunks
        ):
            raise RuntimeError(
                f"{self.name} published discontinuous chunk metadata at chunk {index}: {meta}"
            )
        self.on_chunk(DecodedChunk(frames, index, plan.chunks, self.frame_start))
        self.index += 1
        self.frame_start += got[0]

    def check_complete(self) -> None:
        if self.index != self.plan.chunks:
            raise RuntimeError(
                f"{self.name} published {self.index} chunks, its plan says {self.plan.chunks}"
            )
