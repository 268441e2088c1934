"""Keep the decode's working memory mapped between chunks (glibc's malloc settings).

A chunked decode allocates and frees the same few hundred MB of tensors every chunk.
With glibc's defaults, a decode thread's arena gives that memory back to the kernel
when a chunk's tensors are freed (a heap of the arena is unmapped, or an allocation
past the mmap threshold was its own mapping), so the next chunk takes a page fault,
and the kernel zeroes a page, for every 4 KiB it touches again (how often, with and
without the settings below: benchmarks/results/design_notes.md, "The decode heap").

- `M_MMAP_THRESHOLD` 32 MiB, the largest glibc accepts: tensors up to that size come
  from the arenas, whose memory is reused, not mapped and unmapped each time.
- `M_TRIM_THRESHOLD` 256 MiB: larger than an arena heap (64 MiB), so a decode
  thread's heaps are never unmapped, and the main arena is trimmed only past it.
- `M_ARENA_MAX` 2: the process has two arenas, the main one and one more, and every
  thread allocates from one of them once both exist (glibc's default is up to 8
  arenas per core, a thread each while there are threads enough). A decode is
  several threads (`tiny` on a CPU: the decode thread and two pool threads, plus the
  encoder's), and with an arena each, each kept the peak of its own share mapped;
  with the threads sharing two, what one thread frees another's next allocation
  reuses (a lower peak at the same speed; the current peaks are in
  benchmarks/results/benchmarks.md, "Server memory").

Apply them before other threads allocate (`vaecast serve` does so first thing): a
decode on a worker thread measured as fast as on the main thread with the settings
applied first, and 9-11% slower without them or with them applied after other threads
had allocated (`M_ARENA_MAX` caps the arenas made after it, not those that threads
already hold; benchmarks/results/design_notes.md, "The decode heap").

Setting either threshold turns off glibc's own adaptive thresholds, which is why both
are set. The cost: a process keeps the peak of its decode working set mapped. That is
what a server that decodes again in a moment wants; a one-shot CLI decode does not
need it.

Only glibc has `mallopt` with these meanings; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 256 * 2**20
ARENAS = 2


def retain_decode_heap() -> bool:
    """Apply the settings to this process's malloc; False where it is not glibc's."""
    path = ctypes.util.find_library("c")
    if path is None:
        return False
    try:
        libc = ctypes.CDLL(path)
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = (
        bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
        and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
        and bool(mallopt(M_ARENA_MAX, ARENAS))
    )
    if not applied:
        log.warning("glibc refused the decode heap settings; the defaults stay")
    return applied
