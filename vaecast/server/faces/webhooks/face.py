"""The webhooks face, built from `WebhooksFace()` in the config; its settings are the
server's (`ServerConfig.webhooks`: `--webhook-secret`, `--webhook-url`, ...). Without a
secret it does nothing, and the intake refuses a job that names a `webhook_url`.

It is told of each job this server answers for (`JobManager.job_hooks`) and follows
its transitions: its start and its end each make a message (`messages.py`), sent to
the job's `webhook_url` (its own, or the server's default when it was made: a restart
with another default changes nothing for older jobs), by `sender.py`. One job's messages
go in order (its end waits for its start to be delivered or given up); a message is
tried up to `attempts` times, the waits between tries growing fivefold, every try in
a task of its own so that a slow receiver holds back nothing but its own messages.

A message goes out only once what it states is committed to the store (a crash
after it cannot undo the end a receiver was told of), and each message delivered or
given up is written there (`Store.delivery`). A job's
end is what is owed across a restart: the store gives back a finished job, and if no
delivery of its end is recorded (the process died between the job's end and the
receiver's answer, or while retrying), its end is sent then, with the same
`webhook-id`. A start not delivered before a restart is not sent after it: its job
has ended by then, and its end is.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from standardwebhooks import Webhook

from vaecast.errors import StoreUnavailableError
from vaecast.job.links import with_links
from vaecast.job.record import Transition
from vaecast.job.views import job_object
from vaecast.server.config import WebhookSettings
from vaecast.server.faces.webhooks.messages import (
    BY_EVENT,
    ENDINGS,
    Message,
    message,
    now,
    retry_delays,
    signed_headers,
)
from vaecast.server.faces.webhooks.sender import WebhookSender
from vaecast.server.stream.job import Job
from vaecast.server.stream.manager import JobManager
from vaecast.server.stream.rendition import Rendition
from vaecast.store import Store

log = logging.getLogger("vaecast.webhooks")

# Messages that may be on their way at once; past it a new one is given up at once
# (and logged): memory stays bounded whatever receivers do.
MAX_PENDING = 10_000
DELIVERED, GIVEN_UP = "delivered", "given_up"


@dataclass(frozen=True, slots=True)
class WebhooksFace:
    """Signed webhooks of each job's start and end (settings: `ServerConfig.webhooks`)."""

    name: str = "webhooks"

    def build(self) -> Webhooks:
        return Webhooks(self.name)


class Webhooks:
    """The running webhooks face: its messages on their way, and their tally."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._settings: WebhookSettings | None = None
        self._signer: Webhook | None = None
        self._sender: WebhookSender | None = None
        self._manager: JobManager | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_of_job: dict[str, asyncio.Task[None]] = {}
        self._recorded: asyncio.Task[dict[tuple[str, str], str]] | None = None
        self._tally = {DELIVERED: 0, GIVEN_UP: 0, "failed_tries": 0}

    def add_routes(self, app: web.Application) -> None:
        pass

    async def start(self, manager: JobManager) -> None:
        settings = manager.config.webhooks
        if settings.secret is None:
            return
        if not manager.runners.decodes_here:  # Ray mode: the jobs live on the replicas
            log.warning("webhooks are not sent with --ray yet: --webhook-secret is ignored")
            return
        self._settings, self._manager = settings, manager
        self._signer = Webhook(settings.secret)
        self._sender = WebhookSender(settings.timeout_s, settings.allow_private, settings.senders)
        manager.job_hooks.append(self._job_made)

    def attach(self, rendition: Rendition) -> None:
        pass

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sender is not None:
            await self._sender.close()

    def health(self) -> dict[str, Any] | None:
        if self._settings is None:
            return None
        return {"pending": len(self._tasks), **self._tally}

    # Which messages.

    def _job_made(self, job: Job) -> None:
        url = job.record.webhook_url  # its own, or the server's default when it was made
        if url is None:
            return
        if job.record.is_final:  # given back by the store: its end may still be owed
            self._queue(job.id, self._owed_end(job, url))
            return
        job.observe(functools.partial(self._transition, job, url))

    def _transition(
        self, job: Job, url: str, transition: Transition, event: dict[str, Any] | None
    ) -> None:
        kind = None if event is None else event.get("event")
        if kind in BY_EVENT or kind == "error":
            event_type = ENDINGS[job.record.status] if kind == "error" else BY_EVENT[kind]
            data = with_links(job_object(job.record))
            self._queue(job.id, self._deliver(message(data, event_type, url, now())))

    async def _owed_end(self, job: Job, url: str) -> None:
        event_type = ENDINGS[job.record.status]
        if (job.id, event_type) in await self._delivered_before():
            return
        log.info("webhook %s of %s is owed from before the restart", event_type, job.id)
        await self._deliver(message(with_links(job_object(job.record)), event_type, url, now()))

    async def _delivered_before(self) -> dict[tuple[str, str], str]:
        store = self._store()
        if store is None:
            return {}
        if self._recorded is None:  # read once, for every restored job
            self._recorded = asyncio.create_task(store.deliveries())
        return await asyncio.shield(self._recorded)

    def _store(self) -> Store | None:
        durable = None if self._manager is None else self._manager.durable
        return None if durable is None else durable.store

    # Sending.

    def _queue(self, job_id: str, sending: Any) -> None:
        """Send after the job's previous message is done with (its order kept)."""
        if len(self._tasks) >= MAX_PENDING:
            sending.close()
            log.warning("webhook of %s given up: %d messages already pending", job_id, MAX_PENDING)
            self._tally[GIVEN_UP] += 1
            return
        before = self._last_of_job.get(job_id)
        task = asyncio.create_task(_after(before, sending), name=f"webhook-{job_id}")
        self._tasks.add(task)
        self._last_of_job[job_id] = task
        task.add_done_callback(functools.partial(self._done, job_id))

    def _done(self, job_id: str, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._last_of_job.get(job_id) is task:
            del self._last_of_job[job_id]
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("webhook of %s: %s", job_id, error, exc_info=error)

    async def _deliver(self, sent: Message) -> None:
        settings, sender, signer = self._settings, self._sender, self._signer
        assert settings is not None and sender is not None and signer is not None
        delays = retry_delays(settings.first_retry_s, settings.max_retry_s, settings.attempts)
        error: str | None = None
        tries = 0
        store = self._store()
        for delay in (0.0, *delays):
            await asyncio.sleep(delay)
            tries += 1
            error = await self._committed(store) or await sender.send(
                sent, signed_headers(signer, sent, now())
            )
            if error is None:
                break
            self._tally["failed_tries"] += 1
            log.info("webhook %s to %s, try %d: %s", sent.id, sent.url, tries, error)
        outcome = DELIVERED if error is None else GIVEN_UP
        self._tally[outcome] += 1
        if error is not None:
            log.warning("webhook %s given up after %d tries: %s", sent.id, tries, error)
        if store is not None:
            store.delivery(sent.job_id, sent.type, outcome, tries, error)

    @staticmethod
    async def _committed(store: Store | None) -> str | None:
        """None once what the message states (a job's end) is committed to the store, as
        every answer of the server waits for; else why not (the try fails, and waits)."""
        if store is None:
            return None
        try:
            await store.settle()
        except StoreUnavailableError as error:
            return f"not sent: {error.message}"
        return None


async def _after(before: asyncio.Task[None] | None, sending: Any) -> None:
    if before is not None:
        await asyncio.wait([before])
    await sending
