"""A rendition: one decode of a job's latents, as every face reads it.

A rendition holds its decoder, its MP4 as a `SegmentLog` (which any number of
readers follow at their own pace) and its `FragmentIndex` (each fragment's facts).
That is all the core knows of delivery. What a face needs beyond it (the progressive
face's broadcast to caught-up viewers, say) the face attaches when the rendition is
made: `RenditionHooks` calls each face's hook with every new rendition, and the face
keeps what it made under its own `Attachment` key, typed, as aiohttp's `AppKey` does
for an application.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from vaecast.job.transitions import Variant
from vaecast.models.base import ChunkedDecoder
from vaecast.server.stream.fragment_index import FragmentIndex
from vaecast.server.stream.segment_log import SegmentLog

T = TypeVar("T")


class Attachment(Generic[T]):
    """The key a face keeps one thing of its own under, on each rendition."""

    def __init__(self, name: str, kind: type[T]) -> None:
        self.name, self.kind = name, kind

    def __repr__(self) -> str:
        return f"Attachment({self.name!r})"


class Rendition:
    """One rendition of a job's latents: its decoder, its MP4's log, each of its
    fragments' facts, and what the faces attached to it."""

    def __init__(self, variant: Variant, decoder: ChunkedDecoder, log: SegmentLog) -> None:
        self.variant = variant
        self.decoder = decoder
        self.log = log
        # Each fragment's facts: HLS parts, the finished file's durations, store rows.
        self.fragments = FragmentIndex()
        self._attached: dict[Attachment[Any], Any] = {}

    def attach(self, key: Attachment[T], value: T) -> None:
        """Keep `value` under `key` (a face's, once per rendition)."""
        if key in self._attached:
            raise KeyError(f"{key!r} is attached already")
        self._attached[key] = value

    def attached(self, key: Attachment[T]) -> T | None:
        """What the face of `key` attached, or None (a face that was not configured)."""
        return cast("T | None", self._attached.get(key))


class RenditionHooks:
    """What every new rendition is shown to: each configured face's hook, added as the
    app starts (before the first job is made, the store's restored ones included).

    A hook runs inside the making of a job, on the event loop: it must neither await
    nor raise, and should only attach (a listener of the log, a record of its own)."""

    def __init__(self) -> None:
        self._hooks: list[Callable[[Rendition], None]] = []

    def add(self, hook: Callable[[Rendition], None]) -> None:
        self._hooks.append(hook)

    def __call__(self, rendition: Rendition) -> Rendition:
        for hook in self._hooks:
            hook(rendition)
        return rendition
