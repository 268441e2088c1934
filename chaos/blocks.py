"""The building blocks of hostile requests: what a case is, how its bytes are put
together (ordinary requests, raw heads, multipart bodies, demo JSON), the places a
number can go, and the heads no client library would send. `hostile` draws cases
from these with hypothesis; `catalogue` lists hand-picked ones.
"""

from __future__ import annotations

import json
import random
import re
import struct
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from chaos import files
from chaos.wire import request_head

MAX_PARTS = 20_000


@dataclass(frozen=True, slots=True)
class Targets:
    """What a request is built against: the server's Host and live job ids."""

    host: str
    finished: str = "video_none"
    running: str = "video_none"


@dataclass(frozen=True, slots=True)
class Case:
    """One malformed request: where its hostile part goes (`site`), what that is
    (`value`, short enough for a report), and how to build its bytes (`build`)."""

    family: str
    site: str
    value: str
    build: Callable[[Targets], bytes] = field(repr=False, compare=False)
    needs_jobs: bool = False

    def describe(self) -> str:
        return f"{self.site} <- {self.value}"


def shorten(value: object, limit: int = 48) -> str:
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(text) if isinstance(value, str) else text
    return f"{text[: limit // 2]!r}...({len(text)} chars)"


def http_request(
    method: str,
    target: str,
    headers: list[tuple[str, str]] | None = None,
    body: bytes | Callable[[], bytes] = b"",
) -> Callable[[Targets], bytes]:
    """A builder for an ordinary request whose `target` may name {finished}/{running}."""

    def build(targets: Targets) -> bytes:
        data = body() if callable(body) else body
        path = target.format(finished=targets.finished, running=targets.running)
        return request_head(method, path, targets.host, headers or [], len(data)) + data

    return build


def raw_request(template: bytes) -> Callable[[Targets], bytes]:
    """A builder for bytes sent as they are; `{host}` is filled in."""
    return lambda targets: template.replace(b"{host}", targets.host.encode())


def quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


# Hand-picked numbers that break naive parsers.

BAD_NUMBER_TEXTS = (
    "9" * 10_000,
    "1" + "0" * 4300,
    "²",
    "١٦",
    "\U0001d7d9\U0001d7de",  # mathematical double-struck 16
    "1e10000000",
    "-1e10000000",
    "1e-10000000",
    "-1",
    "-16",
    "0",
    "-0",
    "NaN",
    "nan",
    "inf",
    "-Infinity",
    "1/0",
    "0/0",
    "16/0",
    "16/-1",
    "0x10",
    "1_6",
    " 16",
    "16\x00",
    "",
    "1.5e308",
    "4.9e-324",
    "99999999999999999999",
    "+16",
    "16.0.0",
    "١٢٣/٤",
)


# Where a number goes.

SMALL_LATENTS = files.small_latents()
AUDIO_LATENTS = files.latents_with_audio()


def _audio_with_rate(rate: str) -> bytes:
    data = AUDIO_LATENTS
    (size,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + size])
    header["__metadata__"] = {"audio_sample_rate": rate}
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + size :]


def _with_metadata(key: str, value: str) -> bytes:
    return files.latents_file((16, 2, 2, 2), random.Random(0), metadata={key: value})


def demo_body(field_name: str, literal: str) -> bytes:
    """A small valid demo request with one field's JSON text replaced."""
    fields = {"scene": '"gradient"', "frames": "5", "width": "64", "height": "64"}
    fields["sound"] = "false"
    fields[field_name] = literal
    return ("{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}").encode()


_JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|NaN|-?Infinity")
JSON_HEADERS = [("Content-Type", "application/json")]


def number_sites(value: str) -> dict[str, Callable[[Targets], bytes]]:
    q = quote(value)
    literal = value if _JSON_NUMBER.fullmatch(value) else json.dumps(value)
    sites = {
        "GET /v1/videos ?limit=": http_request("GET", f"/v1/videos?limit={q}"),
        "POST /v1/videos/stream ?fps=": http_request(
            "POST", f"/v1/videos/stream?fps={q}", body=SMALL_LATENTS
        ),
        "POST /v1/videos ?fps=": http_request("POST", f"/v1/videos?fps={q}", body=SMALL_LATENTS),
        "POST /v1/videos form field fps": http_request(
            "POST", "/v1/videos", *multipart_form({"fps": value.encode()}, SMALL_LATENTS)
        ),
        "POST /v1/videos/stream metadata fps": http_request(
            "POST", "/v1/videos/stream", body=lambda: _with_metadata("fps", value)
        ),
        "POST /v1/videos ?audio_sample_rate=": http_request(
            "POST", f"/v1/videos?audio_sample_rate={q}", body=AUDIO_LATENTS
        ),
        "POST /v1/videos metadata audio_sample_rate": http_request(
            "POST", "/v1/videos", body=lambda: _audio_with_rate(value)
        ),
        "POST /v1/videos form field audio_sample_rate": http_request(
            "POST",
            "/v1/videos",
            *multipart_form({"audio_sample_rate": value.encode()}, AUDIO_LATENTS),
        ),
    }
    for name in ("frames", "width", "height", "seed", "fps"):
        sites[f"POST /v1/videos JSON {name} (number)"] = http_request(
            "POST", "/v1/videos", JSON_HEADERS, demo_body(name, literal)
        )
        sites[f"POST /v1/videos JSON {name} (string)"] = http_request(
            "POST", "/v1/videos", JSON_HEADERS, demo_body(name, json.dumps(value))
        )
    return sites


def header_number_sites(value: str) -> dict[str, Callable[[Targets], bytes]]:
    sites = {}
    for job in ("finished", "running"):
        content = f"/v1/videos/{{{job}}}/content"
        for form in (f"bytes={value}-", f"bytes=0-{value}", f"bytes=-{value}", f"bytes={value}"):
            sites[f"GET {job} content Range: {form.replace(value, 'N')}"] = http_request(
                "GET", content, [("Range", form)]
            )
        sites[f"HEAD {job} content Range: bytes=N-"] = http_request(
            "HEAD", content, [("Range", f"bytes={value}-")]
        )
        sites[f"GET {job} events Last-Event-ID"] = http_request(
            "GET", f"/v1/videos/{{{job}}}/events", [("Last-Event-ID", value)]
        )
    return sites


HEADER_UNSAFE = re.compile(r"[\r\n]")
JOB_SITE = re.compile(r"\b(finished|running)\b")  # sites on a live job's content or events


DEMO_FIELDS = ("scene", "frames", "width", "height", "seed", "fps", "model", "sound")


def demo_post(body: bytes) -> Callable[[Targets], bytes]:
    return http_request("POST", "/v1/videos", JSON_HEADERS, body)


# Multipart bodies.


def multipart_form(
    fields: dict[str, bytes], file: bytes | Callable[[], bytes], boundary: str = "rlbX9"
) -> tuple[list[tuple[str, str]], Callable[[], bytes]]:
    """(headers, body builder) of an ordinary form with `fields` and a `file` part."""

    def body() -> bytes:
        data = file() if callable(file) else file
        parts = [
            (f'Content-Disposition: form-data; name="{name}"'.encode(), value)
            for name, value in fields.items()
        ]
        parts.append(
            (
                b'Content-Disposition: form-data; name="file"; filename="z.safetensors"\r\n'
                b"Content-Type: application/octet-stream",
                data,
            )
        )
        return join_parts(parts, boundary)

    return [("Content-Type", f"multipart/form-data; boundary={boundary}")], body


def join_parts(parts: list[tuple[bytes, bytes]], boundary: str, end: bool = True) -> bytes:
    mark = b"--" + boundary.encode()
    out = [mark + b"\r\n" + head + b"\r\n\r\n" + body + b"\r\n" for head, body in parts]
    return b"".join(out) + (mark + b"--\r\n" if end else b"")


MULTIPART_KINDS = (
    "many fields",
    "many same-name fields",
    "huge header line",
    "many part headers",
    "no boundary",
    "empty boundary",
    "long boundary",
    "wrong boundary",
    "unterminated",
    "preamble and epilogue",
    "nested multipart",
    "oversized field",
    "non-UTF-8 names",
    "part without name",
    "two files",
    "encoded part",
    "only fields",
)


_FILE_PART = (b'Content-Disposition: form-data; name="file"; filename="z"', SMALL_LATENTS)
_FPS_FIELD = b'Content-Disposition: form-data; name="fps"'


def _multipart_body(kind: str, boundary: str, count: int, size: int, cut: int) -> bytes:
    """The body of one `MULTIPART_KINDS` case (`count` parts or lines, `size` bytes)."""
    if kind == "many fields":
        names = (f'Content-Disposition: form-data; name="f{i}"'.encode() for i in range(count))
        return join_parts([*((name, b"x") for name in names), _FILE_PART], boundary)
    if kind == "many same-name fields":
        return join_parts([*[(_FPS_FIELD, b"16")] * count, _FILE_PART], boundary)
    if kind == "huge header line":
        head = b'Content-Disposition: form-data; name="file"; filename="' + b"a" * size + b'"'
        return join_parts([(head, SMALL_LATENTS)], boundary)
    if kind == "many part headers":
        head = b"\r\n".join([b"X-Junk: y"] * count + [_FILE_PART[0]])
        return join_parts([(head, SMALL_LATENTS)], boundary)
    if kind == "unterminated":
        return join_parts([_FILE_PART], boundary, end=False)[:-cut]
    if kind == "preamble and epilogue":
        return b"junk\r\n" * 10 + join_parts([_FILE_PART], boundary) + b"more junk" * 100
    if kind == "nested multipart":
        inner = join_parts([_FILE_PART], "inner")
        head = b'Content-Disposition: form-data; name="file"\r\n'
        head += b"Content-Type: multipart/mixed; boundary=inner"
        return join_parts([(head, inner)], boundary)
    if kind == "oversized field":
        return join_parts([(_FPS_FIELD, b"1" * size), _FILE_PART], boundary)
    if kind == "non-UTF-8 names":
        head = b"Content-Disposition: form-data; name=\"\xff\xfe\"; filename*=UTF-8''%ff"
        return join_parts([(head, b"1"), _FILE_PART], boundary)
    if kind == "part without name":
        return join_parts([(b"Content-Disposition: form-data", SMALL_LATENTS)], boundary)
    if kind == "two files":
        second = (b'Content-Disposition: form-data; name="latents"', b"garbage")
        return join_parts([_FILE_PART, second], boundary)
    if kind == "encoded part":
        head = _FILE_PART[0] + b"\r\nContent-Transfer-Encoding: base64\r\nContent-Encoding: gzip"
        return join_parts([(head, b"!!not base64!!")], boundary)
    if kind == "only fields":
        return join_parts([(_FPS_FIELD, b"16")], boundary)
    return join_parts([_FILE_PART], boundary)


_CONTENT_TYPES = {
    "no boundary": "multipart/form-data",
    "empty boundary": 'multipart/form-data; boundary=""',
    "wrong boundary": "multipart/form-data; boundary=other",
}


def multipart_case(
    kind: str, route: str, count: int, size: int, boundary_length: int, cut: int = 10
) -> Case:
    boundary = "b" * boundary_length if kind == "long boundary" else "rlbX9"
    content_type = _CONTENT_TYPES.get(kind, f"multipart/form-data; boundary={boundary}")
    builder = http_request(
        "POST",
        route,
        [("Content-Type", content_type)],
        lambda: _multipart_body(kind, boundary, count, size, cut),
    )
    value = f"{kind} (count {count}, size {size})"
    return Case("multipart", f"POST {route} multipart: {kind}", value, builder)


# Heads no client library would send.


def _h(line: bytes, *headers: bytes, body: bytes = b"", host: bool = True) -> bytes:
    """A raw request: `line`, Host (unless `host` is false), `headers`, then `body`."""
    lines = [line, *([b"Host: {host}"] if host else []), *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


_POST = b"POST /v1/videos HTTP/1.1"
_GET = b"GET /v1/videos HTTP/1.1"
_HEALTH = b"GET /healthz HTTP/1.1"
_CHUNKED = b"Transfer-Encoding: chunked"
BAD_HEADS: dict[str, bytes] = {
    "Content-Length -1": _h(_POST, b"Content-Length: -1"),
    "Content-Length not a number": _h(_POST, b"Content-Length: 1e3"),
    "Content-Length 20 digits": _h(_POST, b"Content-Length: 99999999999999999999", body=b"x"),
    "Content-Length over the body": _h(_POST, b"Content-Length: 1000", body=b"short"),
    "two Content-Lengths": _h(_POST, b"Content-Length: 1", b"Content-Length: 2", body=b"xx"),
    "Content-Length list": _h(_POST, b"Content-Length: 2, 2", body=b"xx"),
    "Content-Length and chunked": _h(_POST, b"Content-Length: 3", _CHUNKED, body=b"0\r\n\r\n"),
    "chunk size not hex": _h(_POST, _CHUNKED, body=b"zz\r\nabc\r\n0\r\n\r\n"),
    "chunk size negative": _h(_POST, _CHUNKED, body=b"-1\r\nabc\r\n0\r\n\r\n"),
    "chunk size 20 hex digits": _h(_POST, _CHUNKED, body=b"ffffffffffffffffffff\r\nabc\r\n"),
    "chunk extension junk": _h(_POST, _CHUNKED, body=b"3;\x01\x02=\xff\r\nabc\r\n0\r\n\r\n"),
    "chunk without CRLF": _h(_POST, _CHUNKED, body=b"3\r\nabcdef0\r\n\r\n"),
    "Transfer-Encoding gzip": _h(_POST, b"Transfer-Encoding: gzip"),
    "Transfer-Encoding chunked twice": _h(
        _POST, b"Transfer-Encoding: chunked, chunked", body=b"0\r\n\r\n"
    ),
    "Content-Encoding gzip of junk": _h(
        _POST, b"Content-Encoding: gzip", b"Content-Length: 4", body=b"junk"
    ),
    "Content-Encoding br of junk": _h(
        b"POST /v1/videos/stream HTTP/1.1",
        b"Content-Encoding: br",
        b"Content-Length: 4",
        body=b"junk",
    ),
    "header without colon": _h(_HEALTH, b"NoColonHere"),
    "space before colon": _h(_HEALTH, b"X-A : b"),
    "NUL in a value": _h(_GET, b"X-A: a\x00b"),
    "bare CR in a value": _h(_GET, b"X-A: a\rb"),
    "obs-fold": _h(_GET, b"X-A: a", b"  folded"),
    "Latin-1 bytes in values": _h(_GET, b"Range: bytes=\xff-", b"Last-Event-ID: \xe9"),
    "HTTP/2.0 in HTTP/1 syntax": _h(b"GET /healthz HTTP/2.0"),
    "HTTP/1.2": _h(b"GET /healthz HTTP/1.2"),
    "HTTP/0.9 request line": _h(b"GET /healthz", host=False),
    "no Host": _h(_GET, host=False),
    "two Hosts": _h(_GET, b"Host: evil.example"),
    "foreign Host": _h(_POST, b"Host: evil.example", b"Content-Length: 0", host=False),
    "Origin null": _h(_POST, b"Origin: null", b"Content-Length: 0"),
    "absolute-form target": _h(b"GET http://{host}/v1/videos HTTP/1.1"),
    "asterisk target": _h(b"OPTIONS * HTTP/1.1"),
    "CONNECT authority": _h(b"CONNECT {host} HTTP/1.1"),
    "lowercase method": _h(b"get /healthz HTTP/1.1"),
    "method with NUL": _h(b"GE\x00T /healthz HTTP/1.1"),
    "Expect 100-continue": _h(_POST, b"Expect: 100-continue", b"Content-Length: 10"),
    "Expect junk": _h(_POST, b"Expect: 999-junk", b"Content-Length: 0"),
    "Upgrade websocket": _h(_GET, b"Connection: Upgrade", b"Upgrade: websocket"),
    "Upgrade h2c": _h(
        _HEALTH, b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: AAMA"
    ),
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "TLS ClientHello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),
    "Content-Type junk": _h(_POST, b"Content-Type: ;;;=\xff", b"Content-Length: 2", body=b"{}"),
    "Content-Type charset junk": _h(
        _POST, b'Content-Type: application/json; charset="x\\"', b"Content-Length: 2", body=b"{}"
    ),
    "Authorization junk": _h(_GET, b"Authorization: Bearer \xff\xfe", b"Cookie: k=%ff%fe"),
    "If-None-Match junk": _h(b"GET /v1/videos/video_x/content HTTP/1.1", b"If-None-Match: ,,,W/"),
}
