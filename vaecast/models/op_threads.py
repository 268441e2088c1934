"""How many threads torch's CPU operators use, set for the calling thread alone.

`torch.set_num_threads` is process-wide in effect: it also stores the count that
every thread torch has not seen yet starts with, so calling it from one decode
would change every other decode, encoder and demo producer started after it. With
torch's OpenMP backend (the CPU wheels') the count an operator actually uses is
OpenMP's `nthreads-var`, which OpenMP keeps per thread: `omp_set_num_threads`,
called through ctypes on the very libgomp torch loaded, changes it for the calling
thread only, and oneDNN's convolutions read the same value. torch sets a thread's
value the first time that thread asks for it, so `thread_ops` asks first and sets
after, and gives the old value back when it ends (a pool thread serves other
decoders next).

Where torch's parallel backend is not OpenMP, or its libgomp cannot be found,
`per_thread_control()` is False and callers keep torch's own threading.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path)  # already loaded: the same handle, no second copy
            library.omp_get_max_threads.restype = ctypes.c_int
            library.omp_set_num_threads.argtypes = [ctypes.c_int]
        except (OSError, AttributeError):
            continue
        return library
    return None


def per_thread_control() -> bool:
    """Whether `thread_ops` can set this thread's operator threads alone."""
    return _libgomp() is not None


@contextmanager
def thread_ops(threads: int) -> Iterator[None]:
    """Torch's CPU operators called from this thread use `threads` threads meanwhile.

    Needs `per_thread_control()`; other threads are not affected.
    """
    library = _libgomp()
    if library is None:
        raise RuntimeError("torch's operator threads cannot be set per thread here")
    torch.get_num_threads()  # torch's first-use setting for this thread happens now, not later
    before = library.omp_get_max_threads()
    library.omp_set_num_threads(max(1, int(threads)))
    try:
        yield
    finally:
        library.omp_set_num_threads(before)
