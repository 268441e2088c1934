"""thread_priority: a lowered pool's threads run ten nice levels below the thread that
started them, and nothing outside the pool changes priority."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest

from vaecast.pipeline import thread_priority
from vaecast.pipeline.thread_priority import lower_this_thread, lowered_nice, lowered_pool

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


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)  # Linux: the calling thread's


def test_a_lowered_thread_is_ten_levels_down_and_the_rest_of_the_process_is_not() -> None:
    ours = _nice()
    got, nice = _in_a_thread(lambda: (lower_this_thread(), _nice()))
    assert nice == lowered_nice(ours) == min(19, ours + 10)
    assert got == f"nice {nice}"
    assert _nice() == ours  # this thread is untouched
    assert _in_a_thread(_nice) == ours  # and so is a thread started after it


def test_a_lowered_pools_threads_are_lowered() -> None:
    pool = lowered_pool(2, "test-lowered")
    try:
        seen = {pool.submit(_nice).result(10) for _ in range(4)}
    finally:
        pool.shutdown()
    assert seen == {lowered_nice(_nice())}


def test_never_below_nice_19() -> None:
    assert lowered_nice(15) == 19
    assert lowered_nice(19) == 19


def test_where_nice_is_refused_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any) -> None:
        raise PermissionError("seccomp (simulated)")

    monkeypatch.setattr(thread_priority.os, "setpriority", refused)
    assert _in_a_thread(lambda: (lower_this_thread(), _nice())) == ("unchanged", _nice())


def test_off_linux_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    # setpriority would lower the whole process there, not a thread.
    monkeypatch.setattr(thread_priority.sys, "platform", "darwin")
    assert _in_a_thread(lambda: (lower_this_thread(), _nice())) == ("unchanged", _nice())
