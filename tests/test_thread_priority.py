"""thread_priority: an idle pool's threads run at SCHED_IDLE (nice 19 where that is
refused), and nothing outside the pool changes priority."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest

from vaecast import thread_priority
from vaecast.thread_priority import LOWEST_NICE, idle_pool, lower_this_thread

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's"
)


def _in_a_thread(work: Any) -> Any:
    """`work()` on a fresh thread (a lowered thread cannot be raised again)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join(10)
    return result[0]


def _policy_and_nice() -> tuple[int, int]:
    return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)


def test_a_lowered_thread_is_idle_and_the_rest_of_the_process_is_not() -> None:
    got, (policy, _) = _in_a_thread(lambda: (lower_this_thread(), _policy_and_nice()))
    assert (got, policy) == ("idle", os.SCHED_IDLE)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # this thread is untouched
    # And so is a thread started after it.
    assert _in_a_thread(_policy_and_nice)[0] == os.SCHED_OTHER


def test_an_idle_pools_threads_are_idle() -> None:
    pool = idle_pool(2, "test-idle")
    try:
        seen = {pool.submit(_policy_and_nice).result(10)[0] for _ in range(4)}
    finally:
        pool.shutdown()
    assert seen == {os.SCHED_IDLE}


def test_where_sched_idle_is_refused_the_thread_gets_nice_19(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(*args: Any) -> None:
        raise PermissionError("seccomp (simulated)")

    monkeypatch.setattr(thread_priority.os, "sched_setscheduler", refused)
    got, (policy, nice) = _in_a_thread(lambda: (lower_this_thread(), _policy_and_nice()))
    assert (got, policy, nice) == (f"nice {LOWEST_NICE}", os.SCHED_OTHER, LOWEST_NICE)
    assert os.getpriority(os.PRIO_PROCESS, 0) != LOWEST_NICE  # this thread is untouched


def test_where_both_are_refused_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any) -> None:
        raise PermissionError("simulated")

    monkeypatch.setattr(thread_priority.os, "sched_setscheduler", refused)
    monkeypatch.setattr(thread_priority.os, "setpriority", refused)
    assert _in_a_thread(lambda: (lower_this_thread(), _policy_and_nice()))[0] == "unchanged"


def test_off_linux_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    # setpriority would lower the whole process there, not a thread.
    monkeypatch.setattr(thread_priority.sys, "platform", "darwin")
    got, (policy, nice) = _in_a_thread(lambda: (lower_this_thread(), _policy_and_nice()))
    assert (got, policy) == ("unchanged", os.SCHED_OTHER)
    assert nice == os.getpriority(os.PRIO_PROCESS, 0)
