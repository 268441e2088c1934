"""`op_threads.thread_ops`: torch's CPU operator threads set for the calling thread
only, and given back."""

from __future__ import annotations

import threading

import pytest
import torch

from vaecast.models.op_threads import per_thread_control, thread_ops


def test_the_torch_wheel_here_allows_it() -> None:
    openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    assert per_thread_control() == openmp


@pytest.mark.skipif(not per_thread_control(), reason="torch's backend is not OpenMP here")
def test_one_threads_setting_leaves_the_others_alone() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        inside = threading.Event()
        release = threading.Event()
        seen: dict[str, int] = {}

        def narrowed() -> None:
            with thread_ops(1):
                seen["inside"] = torch.get_num_threads()
                inside.set()
                release.wait(10)
            seen["after"] = torch.get_num_threads()

        worker = threading.Thread(target=narrowed)
        worker.start()
        assert inside.wait(10)
        # While the worker runs single-threaded operators, this thread, and one started
        # now, still have both.
        seen["main"] = torch.get_num_threads()
        fresh = threading.Thread(target=lambda: seen.setdefault("fresh", torch.get_num_threads()))
        fresh.start()
        fresh.join()
        release.set()
        worker.join()
        assert seen == {"inside": 1, "main": 2, "fresh": 2, "after": 2}
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not per_thread_control(), reason="torch's backend is not OpenMP here")
def test_the_setting_is_given_back_after_an_error() -> None:
    before = torch.get_num_threads()
    with pytest.raises(ValueError), thread_ops(1):
        assert torch.get_num_threads() == 1
        raise ValueError
    assert torch.get_num_threads() == before
