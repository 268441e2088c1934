"""The faces a server serves unless its config lists otherwise."""

from __future__ import annotations

from vaecast.server.config import FaceSpec
from vaecast.server.faces.hls.face import HlsFace
from vaecast.server.faces.progressive.face import ProgressiveFace
from vaecast.server.faces.stills.face import StillsFace
from vaecast.server.faces.webhooks.face import WebhooksFace
from vaecast.server.faces.whep.face import WhepFace
from vaecast.server.faces.whep.settings import WebRtcSettings


def standard_faces(webrtc: WebRtcSettings | None = None) -> tuple[FaceSpec, ...]:
    """The progressive MP4, LL-HLS, WHEP (with `webrtc`'s settings, or the defaults),
    the stills (thumbnails and spritesheets) and the webhooks (sent only where the
    server's config has a secret)."""
    return (
        ProgressiveFace(),
        HlsFace(),
        WhepFace(webrtc or WebRtcSettings()),
        StillsFace(),
        WebhooksFace(),
    )
