"""A rendition's MP4 made a finished file: its init segment states the video's length.

The init segment goes out before any fragment exists, so viewers who follow live get
duration 0 (not known yet: players treat the stream as live). Once a rendition's
pipeline has written its last fragment, and before its log is finished or its job
`Completed` (whose journal fsyncs the store's file), `state_duration` rewrites the
init segment in place with the durations its fragments hold (`fmp4_finish`): so the
finished `/content`, the store's file and the HLS init state them. Every runner
calls it, the local one and the Ray mirror alike.
"""

from __future__ import annotations

import logging

from vaecast.errors import DecodeFailedError
from vaecast.server.stream.rendition import Rendition

log = logging.getLogger("vaecast.jobs")


async def state_duration(rendition: Rendition) -> None:
    """Rewrite `rendition`'s init segment to state the durations tallied from its
    fragments. A stream the tally could not read is left as it streamed (valid, silent
    about its length), with a warning; a store that cannot write fails the job, as the
    pipeline's own writes do."""
    init = rendition.fragments.finished_init()
    if init is None:
        log.warning(
            "%s: its file does not state its duration: %s",
            rendition.variant,
            rendition.fragments.unreadable,
        )
        return
    try:
        await rendition.log.rewrite_init(init)
    except OSError as error:
        raise DecodeFailedError(f"the video could not be stored: {error}") from error
