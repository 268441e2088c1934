"""Parameters, headers and media types that many operations share.

Each constraint is the one the server enforces: an id the manager could have made, a
variant `Job.rendition` knows, an HLS number `hls_routes` parses, a block index the
push ledger reads.
"""

from __future__ import annotations

from vaecast.errors import (
    CancelledByShutdown,
    ClusterUnavailableError,
    DecodeCancelled,
    GoneError,
    InvalidRequestError,
    JobStateError,
    MalformedRequestError,
    NotFoundError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServerBusyError,
    ShuttingDownError,
    UnknownModelError,
    UnsupportedMediaError,
)
from vaecast.job.record import FINAL, LIVE, PREVIEW
from vaecast.latent_files.audio import AUDIO_RATE_KEY
from vaecast.params import MAX_NUMBER_CHARS
from vaecast.push_ledger import MAX_SEQ_DIGITS, SEQ_HEADER
from vaecast.server.config import MAX_FIELD_BYTES, MAX_PREVIEW_NAME
from vaecast.server.contract import models as m
from vaecast.server.contract.spec import ErrorType, Header, Param

JSON = "application/json"
MP4 = "video/mp4"
SSE = "text/event-stream"
M3U8 = "application/vnd.apple.mpegurl"
SDP = "application/sdp"
SAFETENSORS = "application/x-safetensors"
NPY = "application/x-npy"
MULTIPART = "multipart/form-data"
OCTETS = "application/octet-stream"
BINARY = {"type": "string", "contentMediaType": OCTETS}
# What parse_fps takes: a decimal (exponent of up to 3 digits) or a ratio.
FPS_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,3})?(/[0-9]+)?$"
# The longest video id any client could hold ("video_" and 24 hex digits).
VIDEO_ID_PATTERN = r"^video_[0-9a-f]{24}$"

VIDEO_ID = Param(
    "video_id",
    "path",
    {"type": "string", "pattern": VIDEO_ID_PATTERN, "maxLength": 30},
    "the job's id, as `POST /v1/videos` answered it",
    required=True,
)
VARIANT = Param(
    "variant",
    "query",
    {"type": "string", "enum": [FINAL, PREVIEW, LIVE], "default": FINAL},
    "which rendition of a job with a preview decoder (404 for one it lacks): `live` is "
    "each chunk the final's when it came in time to play, else the preview's",
)
# /content's: a rendition, or a still of the final (the stills face's).
CONTENT_VARIANT = Param(
    "variant",
    "query",
    {
        "type": "string",
        "enum": [FINAL, PREVIEW, LIVE, "thumbnail", "spritesheet"],
        "default": FINAL,
    },
    "which rendition of a job with a preview decoder (404 for one it lacks; `live`: each "
    "chunk the final's when it came in time to play, else the preview's), or a "
    "still of its video so far: `thumbnail` (its middle frame) or `spritesheet` (a JPEG "
    "grid of up to 16 evenly spaced frames, `X-Spritesheet` says which)",
)
IMAGE_FORMAT = Param(
    "format",
    "query",
    {"type": "string", "enum": ["webp", "jpeg"]},
    "a thumbnail's image format (WebP by default); a spritesheet is always JPEG",
)
MEDIA_NUMBER = Param(
    "number",
    "path",
    {"type": "integer", "minimum": 0, "maximum": 999_999_999},
    "the part's (or segment's) index, as the playlist lists it",
    required=True,
)
PUSH_SEQ = Param(
    SEQ_HEADER,
    "header",
    {"type": "string", "pattern": rf"^[0-9]{{1,{MAX_SEQ_DIGITS}}}$"},
    "the block's index from 0: a retry of a block already taken is answered again "
    "and adds nothing; once a session numbers its blocks, every block needs it (428)",
)
# A header value up to what the HTTP parser takes (aiohttp: 8190 bytes; past it,
# 400). Within it, a Range, If-None-Match or Last-Event-ID the server cannot read is
# ignored (RFC 9110 14.2: an invalid Range is no range).
HEADER_VALUE = {"type": "string", "maxLength": 8190}
RANGE = Param(
    "Range",
    "header",
    HEADER_VALUE,
    "one byte range (`bytes=a-b`, `bytes=a-`, `bytes=-n`); on a running job, the "
    "committed bytes at once, and an open range past them waits for them",
)
IF_NONE_MATCH = Param("If-None-Match", "header", HEADER_VALUE, "an ETag: 304 if it matches")
LAST_EVENT_ID = Param(
    "Last-Event-ID",
    "header",
    HEADER_VALUE,
    "resume after this event (EventSource sends it on a reconnect); 204 after the last",
)

CACHE_CONTROL = Header(
    "caching: `no-store` while a representation grows (a still of it: `no-cache`)"
)
LOCATION = Header("the URL of what was created")
ETAG = Header("the finished file's entity tag, or a still's")
CONTENT_RANGE = Header("the bytes sent: `bytes a-b/N`, or `bytes a-b/*` while growing")
ACCEPT_RANGES = Header("`bytes`")
VIDEO_ID_HEADER = Header("the id of the job the stream decodes")
PARTIAL = Header("`true`: a failed or cancelled job's video, as far as it got")

# A job's id finds nothing (404), a job since evicted or deleted (410), or, with --ray,
# a cluster that cannot say (503: the lookup of a job another front end made).
JOB_LOOKUP_ERRORS = (NotFoundError, GoneError, ClusterUnavailableError)
MP4_BODY = {"type": "string", "contentMediaType": MP4}
WEBP = "image/webp"
JPEG = "image/jpeg"
STILL_FRAME = Header("a thumbnail's frame (0 is the first)")
SPRITESHEET_LAYOUT = Header(
    "a spritesheet's grid: `columns=4; rows=2; tile=160x90; covered=33; frames=1,3,...` "
    "(tile i, row-major, shows frame i of `frames`, of the `covered` frames so far)"
)
# 416 is answered by content.py itself (no VaecastError names it).
RANGE_NOT_SATISFIABLE = ErrorType(416, "range_not_satisfiable")
# What a request for a job's bytes can be refused with: no such job or rendition, a
# bad ?variant, a job that failed or was cancelled (409), evicted (410), or stopped by
# a shutdown (503: its bytes are elsewhere, or nowhere).
CONTENT_ERRORS = (
    *JOB_LOOKUP_ERRORS,
    InvalidRequestError,
    JobStateError,
    DecodeCancelled,
    CancelledByShutdown,
)

# The parameters of an upload, in the query string (a multipart form's text field of
# the same name wins); a latent file's own metadata gives them too.
UPLOAD_PARAMS = (
    Param("model", "query", {"type": "string", "maxLength": 200}, "the decoder (404 if unknown)"),
    Param(
        "fps",
        "query",
        {"type": "string", "maxLength": MAX_NUMBER_CHARS, "pattern": FPS_PATTERN},
        "frames per second, 1 to 240: a decimal or a ratio like 30000/1001",
    ),
    Param(
        "preview",
        "query",
        {"type": "string", "minLength": 1, "maxLength": MAX_PREVIEW_NAME},
        "a fast decoder of the same latent space, streamed first (`none`: no preview)",
    ),
    Param(
        "webhook_url",
        "query",
        {"type": "string", "maxLength": MAX_FIELD_BYTES, "format": "uri"},
        "where the job's start and end are POSTed, signed (a server with "
        "--webhook-secret only; a private address needs --webhook-allow-private)",
    ),
    Param(
        "width",
        "query",
        {"type": "string", "pattern": "^[0-9]{1,7}$"},
        "crop to this width (with height); a packed layout's width",
    ),
    Param(
        "height",
        "query",
        {"type": "string", "pattern": "^[0-9]{1,7}$"},
        "crop to this height (with width); a packed layout's height",
    ),
    Param(
        "num_frames",
        "query",
        {"type": "string", "pattern": "^[0-9]{1,7}$"},
        "a packed layout's frame count (a pipeline's packed latents)",
    ),
    Param(
        AUDIO_RATE_KEY,
        "query",
        {"type": "string", "pattern": "^[0-9]{1,6}$"},
        "the sample rate of the file's `audio` tensor, in Hz",
    ),
)
LATENT_FILE = {
    **BINARY,
    "description": "a safetensors file (tensor `latents`, BCTHW or CTHW, optional "
    "`audio` (a waveform) or `audio_latents` (for a model with a sound decoder: LTX-2)) or "
    "a .npy array (never unpickled); anything else is 415",
}
LATENT_FORM = {
    "type": "object",
    "properties": {
        "file": {**LATENT_FILE, "description": "the latent file (or in a part `latents`)"},
        "latents": LATENT_FILE,
        "model": {"type": "string", "maxLength": MAX_FIELD_BYTES},
        "fps": {"type": "string", "maxLength": MAX_FIELD_BYTES},
        "preview": {"type": "string", "maxLength": MAX_FIELD_BYTES},
        "webhook_url": {"type": "string", "maxLength": MAX_FIELD_BYTES},
    },
}
# The raw body is the file itself (sniffed, never trusted by its Content-Type).
LATENT_BODY = {
    SAFETENSORS: LATENT_FILE,
    NPY: LATENT_FILE,
    OCTETS: LATENT_FILE,
    MULTIPART: LATENT_FORM,
}
# A JSON body the upload routes take beside the latent files.
UPLOAD_BODY = {**LATENT_BODY, JSON: {"oneOf": [m.DemoRequest, m.PushSessionRequest]}}
# What reading and admitting an upload can refuse.
UPLOAD_ERRORS = (
    MalformedRequestError,
    RequestTimeoutError,
    PayloadTooLargeError,
    UnsupportedMediaError,
    InvalidRequestError,
    UnknownModelError,
    ServerBusyError,
    ShuttingDownError,
    ClusterUnavailableError,
)
