"""The blocking transport both synchronous clients send their requests with.

One request on one new `http.client` connection (a generator may take longer between
blocks than a server keeps an idle keep-alive connection open), its failures turned
into the caller's `ApiError` class: no answer in time (`timeout`) or none at all
(`connection_error`). The caller reads the response and closes the connection.
"""

from __future__ import annotations

import contextlib
import http.client
from urllib.parse import urlsplit

from vaecast.client.protocol import ApiError, Request


def open_request(
    url: str, request: Request, timeout: float | None, error_class: type[ApiError]
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send `request` to `url` (its full URL); the connection and its response."""
    parts = urlsplit(url)
    connection_type = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_type(parts.hostname or "", parts.port, timeout=timeout)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        # A server may answer (401, 413) before reading a whole body: read that answer.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.request(request.method, target, request.body, request.headers)
        return connection, connection.getresponse()
    except TimeoutError as error:
        connection.close()
        raise error_class(0, "timeout", f"{request.method} {target}: no answer") from error
    except (OSError, http.client.HTTPException) as error:
        connection.close()
        where = f"{request.method} {target}"
        raise error_class(0, "connection_error", f"{where}: {error}") from error
