"""Generated malformed requests: any answer but a 5xx, in time, and /healthz after."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from chaos import files, wire
from chaos.blocks import Case, Targets
from chaos.client import Client, Health
from chaos.faults import SLOW_MODEL
from chaos.results import Category, Finding

# A hostile request must be answered within this; the slowest legitimate one here
# (a Range on a running job waits for the job) takes about a second.
ANSWER_BOUND_S = 10.0


# A slow job decodes for at least 12 x 30 ms: one younger than this is still running.
RUNNING_REUSE_S = 0.25


class JobTargets:
    """Live job ids for the cases that need them: a running job (shared while it is
    young), a finished one renewed before retention can evict it (or a DELETE)."""

    def __init__(self, client: Client, renew_after_s: float) -> None:
        self.client = client
        self.renew_after_s = renew_after_s
        self._finished = self._running = "video_none"
        self._finished_at = self._running_at = -float("inf")
        self._lock = asyncio.Lock()

    async def for_case(self, case: Case) -> Targets:
        if not case.needs_jobs:
            return Targets(self.client.host)
        return Targets(
            self.client.host, finished=await self._finished_job(), running=await self._running_job()
        )

    async def _running_job(self) -> str:
        if time.monotonic() - self._running_at > RUNNING_REUSE_S:
            job = await self.client.create_job(files.slow_job_latents(), {"model": SLOW_MODEL})
            if job is not None:
                self._running, self._running_at = job["id"], time.monotonic()
        return self._running

    async def _finished_job(self) -> str:
        async with self._lock:
            if time.monotonic() - self._finished_at > self.renew_after_s:
                job = await self.client.create_job(files.small_latents())
                if job is not None:
                    await self.client.wait_final(job["id"], 30.0)
                    self._finished, self._finished_at = job["id"], time.monotonic()
            return self._finished


def judge(case: Case, answer: wire.Answer, health: Health) -> Finding | None:
    finding = _answer_finding(case, answer)
    if finding is None and not health.ok:
        return Finding(
            f"unhealthy after {case.site}", case.describe(), health.detail, "/healthz 200 after"
        )
    return finding


def _answer_finding(case: Case, answer: wire.Answer) -> Finding | None:
    request = case.describe()
    if answer.status is None:
        if answer.problem == wire.CLOSED_WHILE_SENDING:
            return None  # refusing to read the rest of a hostile request is fair
        problem = answer.problem or "no answer"
        return Finding(f"{case.site}: {problem}", request, answer.describe(), "an HTTP answer")
    if answer.status >= 500:
        return Finding(
            f"{case.site}: {answer.status}", request, answer.describe(), "a 4xx (or 2xx) answer"
        )
    if answer.head_s > ANSWER_BOUND_S:
        expected = f"an answer within {ANSWER_BOUND_S:g} s"
        return Finding(f"{case.site}: slow answer", request, answer.describe(), expected)
    return None


async def run(client: Client, cases: list[Case], workers: int, renew_after_s: float) -> Category:
    category = Category("malformed requests")
    targets = JobTargets(client, renew_after_s)
    statuses: Counter[str] = Counter()
    slowest = 0.0
    pending = list(reversed(cases))

    async def worker() -> None:
        nonlocal slowest
        while pending:
            case = pending.pop()
            # Off this loop: a bomb takes a second to compress, and would stall the
            # other workers' requests and health checks (and their timings).
            data = await asyncio.to_thread(case.build, await targets.for_case(case))
            answer = await wire.exchange(client.server.port, data, ANSWER_BOUND_S + 5)
            statuses[str(answer.status or answer.problem)] += 1
            slowest = max(slowest, answer.head_s)
            category.record(judge(case, answer, await client.health()))

    await asyncio.gather(*(worker() for _ in range(workers)))
    category.figures = {
        "statuses": dict(statuses.most_common()),
        "families": dict(Counter(case.family for case in cases)),
        "slowest_answer_s": round(slowest, 3),
        "answer_bound_s": ANSWER_BOUND_S,
    }
    return category
