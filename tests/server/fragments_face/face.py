"""The fragments face: a rendition's fragment index as JSON, and a listener of its log.

Written only against `vaecast.embed` (and `vaecast.errors`), as a face of one's own
outside vaecast would be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from vaecast.embed import (
    JOB_LOOKUP_ERRORS,
    JSON,
    MANAGER,
    VARIANT,
    VIDEO_ID,
    Attachment,
    JobManager,
    Rendition,
    Reply,
    operation,
    rendition_of,
)
from vaecast.errors import InvalidRequestError

FRAGMENT = {
    "type": "object",
    "required": ["duration_s", "keyframe"],
    "properties": {"duration_s": {"type": "number"}, "keyframe": {"type": "boolean"}},
}


class SegmentCounter:
    """A listener of one rendition's log: the segments appended, and whether it closed."""

    def __init__(self) -> None:
        self.segments = 0
        self.closed_once = False

    def appended(self, segment: bytes) -> None:
        self.segments += 1

    def closed(self) -> None:
        self.closed_once = True


COUNTER = Attachment("fragments.counter", SegmentCounter)


@operation(
    "Each fragment of a job's video, with its facts",
    tag="content",
    params=(VIDEO_ID, VARIANT),
    replies=(Reply(200, "the fragments so far", {JSON: {"type": "array", "items": FRAGMENT}}),),
    errors=(*JOB_LOOKUP_ERRORS, InvalidRequestError),
)
async def get_fragments(request: web.Request) -> web.Response:
    job = request.app[MANAGER].get(request.match_info["video_id"])
    rendition = rendition_of(request, job)
    facts = [
        {"duration_s": fact.duration_s, "keyframe": fact.keyframe}
        for fact in rendition.fragments.facts
    ]
    return web.json_response(facts)


@dataclass(frozen=True, slots=True)
class FragmentsFace:
    name: str = "fragments"

    def build(self) -> FragmentLists:
        return FragmentLists(self.name)


class FragmentLists:
    def __init__(self, name: str) -> None:
        self.name = name
        self.started = self.closed = False
        self.counters: list[SegmentCounter] = []

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/videos/{video_id}/fragments", get_fragments)

    async def start(self, manager: JobManager) -> None:
        self.started = True

    def attach(self, rendition: Rendition) -> None:
        counter = SegmentCounter()
        rendition.log.add_listener(counter)
        rendition.attach(COUNTER, counter)
        self.counters.append(counter)

    async def close(self) -> None:
        self.closed = True

    def health(self) -> dict[str, Any] | None:
        return {
            "renditions": len(self.counters),
            "segments": sum(c.segments for c in self.counters),
        }
