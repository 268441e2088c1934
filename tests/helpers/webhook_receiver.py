"""A webhook receiver on 127.0.0.1: a real HTTP server in a thread that keeps what it
is sent and answers as the test says (`answer(message_type, try_number) -> status`)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # Standard Webhooks' own example key


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.body)


class Receiver:
    def __init__(self, answer: Callable[[str, int], int], delay_s: float = 0.0) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self.url = ""

    def take(self, headers: dict[str, str], body: bytes) -> int:
        with self._lock:
            kind = json.loads(body).get("type", "")
            tries = 1 + sum(r.json.get("type") == kind for r in self.received)
            status = self.answer(kind, tries)
            self.received.append(Received(headers, body, status))
        time.sleep(self.delay_s)
        return status

    def of(self, kind: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.json["type"] == kind]

    def types(self) -> list[str]:
        with self._lock:
            return [r.json["type"] for r in self.received]


@contextlib.contextmanager
def receiving(answer: Callable[[str, int], int] = lambda kind, tries: 200, delay_s: float = 0.0
              ) -> Iterator[Receiver]:  # fmt: skip
    receiver = Receiver(answer, delay_s)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            status = receiver.take(dict(self.headers.items()), body)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
