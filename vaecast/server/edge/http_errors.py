"""The edge where errors become HTTP: every failure leaves as JSON, never a traceback.

`{"error": {"type": ..., "message": ...}}` with the status the error class names
(vaecast.errors); aiohttp's own HTTP exceptions (unknown route, wrong method) get
the same shape; anything unexpected is logged with its traceback and answered 500
with a generic message.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from vaecast.errors import (
    RequestTimeoutError,
    ServerBusyError,
    UnauthorizedError,
    VaecastError,
)

log = logging.getLogger("vaecast.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(
    status: int, error_type: str, message: str, fields: dict[str, object] | None = None
) -> web.Response:
    body = {"type": error_type, "message": message, **(fields or {})}
    return web.json_response({"error": body}, status=status)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ServerBusyError as error:
        response = error_response(error.status, error.type, error.message)
        response.headers["Retry-After"] = str(error.retry_after_s)
        return response
    except UnauthorizedError as error:
        # RFC 9110: a 401 names the authentication scheme the server takes.
        response = error_response(error.status, error.type, error.message)
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
    except RequestTimeoutError as error:
        # The rest of the body may never come: do not wait for it to reuse the connection.
        response = error_response(error.status, error.type, error.message)
        response.force_close()
        return response
    except VaecastError as error:
        return error_response(error.status, error.type, error.message, error.fields())
    except web.HTTPException as error:
        if error.status < 400:
            raise
        response = error_response(
            error.status, error.reason.lower().replace(" ", "_"), error.reason
        )
        for name in ("Allow", "Retry-After"):
            if name in error.headers:
                response.headers[name] = error.headers[name]
        return response
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, "internal_error", "internal server error (see the server log)")
