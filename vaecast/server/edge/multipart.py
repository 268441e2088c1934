"""A bounded multipart/form-data parser: bytes in, parts out (RFC 7578, RFC 2046).

It exists instead of aiohttp's `MultipartReader` for two reasons:
- aiohttp (3.14) parses part by part on the event loop, about 0.24 ms a part, with no cap on
  the number of parts: a body of 40,000 tiny fields held the server's loop for ~9 s;
- a part header line over 8,190 bytes makes aiohttp raise an error the server answered with
  500 instead of 400.
Here the server reads the (size-limited) body itself and calls `parse_form` in a worker thread.
The parser is sans-IO on purpose (no asyncio, no aiohttp), so it can run off the loop and be
tested on plain bytes. It refuses a body with more than `max_parts` parts as soon as it meets
part `max_parts + 1`, so its time is proportional to the parts it accepts, not to the body.
Delimiters are found with `bytes.find` (C speed), look-alikes in part data are skipped by a
regex (also C), and the cost is linear in the bytes scanned.

Decisions, each a deliberate one:
- Line endings are CRLF, as every client sends them. Bare-LF bodies are refused rather than
  guessed at: with LF allowed, part data that ends in CR would lose its last byte.
- A delimiter-looking run inside part data that is not followed by `--`, padding or CRLF is
  taken as data (RFC 2046 forbids it, but refusing it helps nobody).
- `name` and `filename` are quoted-strings with backslash escapes (RFC 7230, what aiohttp
  sends), and `%22`, `%0D`, `%0A` are then decoded to `"`, CR, LF (what browsers and urllib3
  send, per the WHATWG form encoding). No other percent-decoding: a browser sends a literal
  `%` as is. `filename*=` (RFC 5987) and other parameters are ignored.
- Header values are UTF-8 (browsers send names and filenames raw); anything else is refused.
- `Content-Transfer-Encoding` is ignored (RFC 7578 deprecates it): data is passed through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vaecast.errors import MalformedRequestError

__all__ = ["FormPart", "boundary_of", "parse_form"]


@dataclass(frozen=True, slots=True)
class FormPart:
    """One part of a form.

    `data` is a `bytes` copy of the part's content (one slice of the body, made once): the
    latent loader needs real bytes, and a copy lets the caller drop the whole body, so a large
    upload is held twice only for the moment between parsing and dropping the body.
    `content_type` is the part's Content-Type header value as sent, or None.
    """

    name: str
    filename: str | None
    content_type: str | None
    data: bytes


# RFC 2046 bchars; the last character may not be a space.
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_QUOTED = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"', re.DOTALL)
_QUOTED_PAIR = re.compile(r"\\(.)", re.DOTALL)
_UNQUOTED_VALUE = re.compile(r'[^;"\s]+')
_OWS = re.compile(r"[ \t]*")
# After `--boundary`: transport padding, then the CRLF that ends the delimiter line.
_LINE_END = re.compile(rb"[ \t]*\r\n")
_HEADER = re.compile(r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*(.*?)[ \t]*")
_FORM_ESCAPES = re.compile(r"%0A|%0D|%22")
_FORM_UNESCAPED = {"%0A": "\n", "%0D": "\r", "%22": '"'}
_SNIPPET_CHARS = 60
_BLANKS = " \t"
_SINGLE_HEADERS = {"content-disposition": "Content-Disposition", "content-type": "Content-Type"}
# `_after_delimiter`'s answer for the closing delimiter: no part follows.
_CLOSED = -1


def boundary_of(content_type_header: str) -> str:
    """The boundary of a `multipart/form-data` Content-Type header value.

    Raises MalformedRequestError when the type is not multipart/form-data or the boundary is
    missing or not 1-70 RFC 2046 characters.
    """
    media_type, params = _parse_parameters("Content-Type", content_type_header)
    if media_type.lower() != "multipart/form-data":
        raise MalformedRequestError(
            f"the Content-Type is {_snippet(media_type)}; a form upload is multipart/form-data"
        )
    boundary = params.get("boundary")
    if boundary is None:
        raise MalformedRequestError(
            "the multipart/form-data Content-Type has no boundary parameter"
        )
    _check_boundary(boundary)
    return boundary


def parse_form(
    body: bytes, boundary: str, *, max_parts: int = 64, max_head_bytes: int = 16 * 1024
) -> list[FormPart]:
    """The parts of a multipart/form-data body, in order.

    The preamble and epilogue are ignored; the closing delimiter is required. Raises
    MalformedRequestError for a malformed or truncated body, more than `max_parts` parts, a
    part whose headers are over `max_head_bytes`, a part without a form-data name, or a
    nested multipart part.
    """
    _check_boundary(boundary)
    dash_boundary = b"--" + boundary.encode("ascii")
    delimiter = b"\r\n" + dash_boundary
    position = (
        _after_delimiter(body, 0, len(dash_boundary)) if body.startswith(dash_boundary) else None
    )
    if position is None:
        found = _find_delimiter(body, delimiter, 0)
        if found is None:
            raise MalformedRequestError(
                f"the multipart body has no complete boundary line '--{boundary}': is the body "
                "truncated, or is the boundary in the Content-Type not the one it uses?"
            )
        position = found[1]
    parts: list[FormPart] = []
    while position != _CLOSED:
        if len(parts) == max_parts:
            raise MalformedRequestError(
                f"the form has more than {max_parts} parts, the most this server accepts"
            )
        # Searching from the delimiter line's own CRLF finds an empty head as well.
        head_end = body.find(b"\r\n\r\n", position - 2, position + max_head_bytes + 4)
        if head_end < 0:
            if len(body) >= position + max_head_bytes + 4:
                raise MalformedRequestError(
                    f"the part headers are too long: at most {max_head_bytes} bytes of headers "
                    "are accepted per part"
                )
            raise MalformedRequestError(
                "a part's headers do not end with an empty line; is the body truncated?"
            )
        head = body[position:head_end] if head_end >= position else b""
        data_start = head_end + 4
        found = _find_delimiter(body, delimiter, data_start)
        if found is None:
            raise MalformedRequestError(
                f"the multipart body ends before its closing boundary '--{boundary}--'; "
                "is the upload truncated?"
            )
        data_end, next_position = found
        parts.append(_part(head, body[data_start:data_end]))
        position = next_position
    return parts


def _find_delimiter(body: bytes, delimiter: bytes, start: int) -> tuple[int, int] | None:
    """The first real delimiter from `start`: (where it starts, what `_after_delimiter` says)."""
    found = body.find(delimiter, start)
    if found < 0:
        return None
    after = _after_delimiter(body, found, len(delimiter))
    if after is not None:
        return found, after
    # A false match. A hostile body can hold millions of them, ~0.7 us each in a Python loop;
    # the regex skips them in C. It is not used from the start because on ordinary data it
    # scans at about half the speed of bytes.find.
    real = re.compile(re.escape(delimiter) + rb"(--|[ \t]*\r\n)")
    match = real.search(body, found + len(delimiter))
    if match is None:
        return None
    return match.start(), _CLOSED if match[1] == b"--" else match.end()


def _after_delimiter(body: bytes, found: int, length: int) -> int | None:
    """After a delimiter at `found`: the next part's start, _CLOSED, or None if not one."""
    end = found + length
    if body.startswith(b"--", end):
        return _CLOSED
    line_end = _LINE_END.match(body, end)
    return None if line_end is None else line_end.end()


def _check_boundary(boundary: str) -> None:
    if _BOUNDARY.fullmatch(boundary) is None:
        raise MalformedRequestError(
            f"the multipart boundary {_snippet(boundary)} is not valid: it must be 1 to 70 "
            "letters, digits, spaces or '()+_,-./:=? and not end with a space"
        )


def _part(head: bytes, data: bytes) -> FormPart:
    headers = _parse_head(head)
    disposition = headers.get("content-disposition")
    if disposition is None:
        raise MalformedRequestError(
            "a form part has no Content-Disposition header; each part needs "
            "'Content-Disposition: form-data; name=\"...\"'"
        )
    disposition_type, params = _parse_parameters("Content-Disposition", disposition)
    if disposition_type.lower() != "form-data":
        raise MalformedRequestError(
            f"a part's Content-Disposition is {_snippet(disposition_type)}, not form-data"
        )
    name = params.get("name")
    if not name:
        raise MalformedRequestError(
            "a form part has no name; each part needs 'Content-Disposition: form-data; "
            'name="..."\''
        )
    content_type = headers.get("content-type")
    if content_type is not None and content_type.lower().startswith("multipart/"):
        raise MalformedRequestError("nested multipart bodies are not supported")
    filename = params.get("filename")
    return FormPart(
        name=_form_unescape(name),
        filename=None if filename is None else _form_unescape(filename),
        content_type=content_type,
        data=data,
    )


def _parse_head(head: bytes) -> dict[str, str]:
    """The headers a form part uses (lower-case names); unfolds obsolete line folding."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedRequestError("a part's headers are not UTF-8 text") from None
    lines: list[tuple[str, str]] = []
    for line in text.split("\r\n") if text else ():
        if "\r" in line or "\n" in line:
            raise MalformedRequestError(
                f"a part header contains a bare CR or LF: {_snippet(line)}; lines end in CRLF"
            )
        if line[:1] in (" ", "\t") and lines:
            name, value = lines[-1]
            lines[-1] = (name, f"{value} {line.strip(_BLANKS)}".strip(_BLANKS))
            continue
        match = _HEADER.fullmatch(line)
        if match is None:
            raise MalformedRequestError(
                f"a part header line is not 'Name: value': {_snippet(line)}"
            )
        lines.append((match[1].lower(), match[2]))
    headers: dict[str, str] = {}
    for name, value in lines:
        if name in _SINGLE_HEADERS and name in headers:
            raise MalformedRequestError(
                f"a form part has more than one {_SINGLE_HEADERS[name]} header"
            )
        headers[name] = value
    return headers


def _parse_parameters(header: str, text: str) -> tuple[str, dict[str, str]]:
    """`value *(; name=token-or-quoted-string)` -> (value, lower-case names to values)."""
    main_end = text.find(";")
    main = (text if main_end < 0 else text[:main_end]).strip(" \t")
    if not main:
        raise MalformedRequestError(f"the {header} header is empty or has no value before ';'")
    params: dict[str, str] = {}
    position = len(text) if main_end < 0 else main_end
    while position < len(text):
        position = _OWS.match(text, position).end()
        if position == len(text):
            break
        if text[position] != ";":
            raise _unparsable(header, text, "expected ';' between parameters")
        position = _OWS.match(text, position + 1).end()
        if position == len(text) or text[position] == ";":
            continue  # an empty parameter, as in a trailing ';'
        name_match = _TOKEN.match(text, position)
        if name_match is None:
            raise _unparsable(header, text, "a parameter name is missing")
        position = _OWS.match(text, name_match.end()).end()
        if not text.startswith("=", position):
            raise _unparsable(header, text, f"parameter {name_match[0]!r} has no '='")
        position = _OWS.match(text, position + 1).end()
        if text.startswith('"', position):
            value_match = _QUOTED.match(text, position)
            if value_match is None:
                raise _unparsable(header, text, "a quoted string is not closed")
            value = _QUOTED_PAIR.sub(r"\1", value_match[1])
        else:
            value_match = _UNQUOTED_VALUE.match(text, position)
            if value_match is None:
                raise _unparsable(header, text, f"parameter {name_match[0]!r} has no value")
            value = value_match[0]
        name = name_match[0].lower()
        if name in params:
            raise _unparsable(header, text, f"parameter {name!r} is given twice")
        params[name] = value
        position = value_match.end()
    return main, params


def _unparsable(header: str, text: str, reason: str) -> MalformedRequestError:
    return MalformedRequestError(f"the {header} header {_snippet(text)} cannot be parsed: {reason}")


def _form_unescape(value: str) -> str:
    # One pass, so "%2522" stays "%22" instead of being decoded twice.
    return _FORM_ESCAPES.sub(lambda match: _FORM_UNESCAPED[match[0]], value)


def _snippet(text: str) -> str:
    """`text` quoted for an error message, shortened: messages echo what the user sent."""
    if len(text) <= _SNIPPET_CHARS:
        return repr(text)
    return repr(text[:_SNIPPET_CHARS]) + "..."
