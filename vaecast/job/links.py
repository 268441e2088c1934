"""A job object's links: the URLs of what a job offers (its content, events, playlists,
stills), as the API answers it and as a webhook carries it."""

from __future__ import annotations

from typing import Any

from vaecast.job.record import LIVE, PREVIEW


def job_urls(job_id: str) -> dict[str, str]:
    base = f"/v1/videos/{job_id}"
    return {
        "self": base,
        "content": f"{base}/content",
        "events": f"{base}/events",
        "playlist": f"{base}/playlist.m3u8",
        "thumbnail": f"{base}/content?variant=thumbnail",
        "spritesheet": f"{base}/content?variant=spritesheet",
    }


def with_links(job_object: dict[str, Any], queue_position: int | None = None) -> dict[str, Any]:
    urls = job_urls(job_object["id"])
    if "variants" in job_object:  # a job with a preview: each rendition's, and the master
        base = urls["self"]
        urls |= {
            "preview_content": f"{base}/content?variant={PREVIEW}",
            "preview_playlist": f"{base}/{PREVIEW}/playlist.m3u8",
            "master_playlist": f"{base}/master.m3u8",
        }
        if LIVE in job_object["variants"]:  # its preview and final line up
            urls |= {
                "live_content": f"{base}/content?variant={LIVE}",
                "live_playlist": f"{base}/{LIVE}/playlist.m3u8",
            }
    return {**job_object, "queue_position": queue_position, "urls": urls}
