"""The errors aiohttp answers itself, as JSON like every other error of this server.

A request aiohttp cannot parse (a malformed request line, bad headers, a broken chunked
body) is answered by its connection handler, `RequestHandler.handle_error`, before any
middleware runs and in plain text. aiohttp 3.14 offers no hook for that response
(aiohttp issues #3287 and #6463: middlewares and `on_response_prepare` never see it), so
the one method is replaced in a subclass, and the runner's server makes its connections
with it (`answer_in_json`). A request the client sent broken (a parser's 4xx) is its
mistake, not the server's: one INFO line, where aiohttp logs an ERROR with a traceback
for each (a client could fill the log that way). Other errors, and the refusal to
answer twice on a connection whose response has begun, stay aiohttp's.
"""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from vaecast.server.edge.http_errors import error_response

# A parser's message echoes what the client sent on its later lines: the first is the reason.
MAX_REASON_CHARS = 200


class JsonErrorsRequestHandler(RequestHandler):
    """aiohttp's connection handler, its own error answers in the server's JSON shape."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status < 500 and isinstance(exc, HttpProcessingError):
            first_line = (message or str(exc)).strip().splitlines()[:1]
            self.logger.info(
                "unparseable request from %s: %s", request.remote, "".join(first_line)[:200]
            )
            if request.writer.output_size > 0:  # as aiohttp: no second answer
                raise ConnectionError("a response was begun: no error answer can follow")
        else:
            super().handle_error(request, status, exc, message)  # logs; raises if begun
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Error"
        error_type = phrase.lower().replace(" ", "_").replace("-", "_")
        if status >= 500 or not message:
            text = "internal server error (see the server log)" if status >= 500 else phrase
        else:
            reason = message.strip().splitlines()[0].rstrip(":")[:MAX_REASON_CHARS]
            text = f"the request cannot be parsed: {reason}"
        response = error_response(status, error_type, text)
        response.force_close()
        return response


class _JsonErrorsServer(web.Server):
    """The app's server, its connections handled by `JsonErrorsRequestHandler`."""

    def __call__(self) -> RequestHandler:
        return JsonErrorsRequestHandler(self, loop=self._loop, **self._kwargs)


def answer_in_json(runner: web.BaseRunner) -> None:
    """After `runner.setup()`, before its sites start: its connections answer the
    requests aiohttp cannot parse with JSON errors.

    The server the runner made is given the subclass above (it adds behaviour, no
    state): aiohttp builds the server inside the runner and takes no handler class.
    """
    server = runner.server
    assert server is not None, "call after runner.setup()"
    server.__class__ = _JsonErrorsServer
