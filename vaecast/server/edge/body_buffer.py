"""A request body read into one buffer that grows without copies or heap holes.

`bytearray += chunk` grows by `realloc` with a 1/8 margin. Below glibc's mmap
threshold (32 MiB with `vaecast.pipeline.heap`'s settings) the buffer lives in the malloc
arena, where a growth that cannot extend in place copies the body and leaves its
old block behind as a hole; and since the server keeps freed memory mapped for the
next decode (`vaecast/pipeline/heap.py`), the holes stay in its RSS
(benchmarks/results/design_notes.md, "Request bodies", has what it cost).

So a body that passes `SMALL_BODY_BYTES` moves once into a buffer whose room is
above that threshold: it is then its own mapping, its untouched pages cost no
memory, and growing it further is an `mremap` (no copy, no hole). At the end the
buffer is cut to the body, a `bytearray` like any other (the latent loader's
tensors are views of it).

Python cannot give a `bytearray` room without writing every byte (`bytearray(n)`
zero-fills it, which would commit the whole room), so the room is made with
`PyByteArray_Resize`, the CPython C API that `bytearray` itself grows with, called
through ctypes. Bytes past the body are never read and are cut off by `take`.

The room is advised for transparent huge pages (`madvise(MADV_HUGEPAGE)`, where the
kernel offers them only on request, as on Debian's default): the body's first write to
each page of a fresh mapping is a page fault, on the event loop before the decode can
start, and with 2 MiB pages there are 512 times fewer. The advice costs at
most one huge page beyond the body; where the kernel has no huge pages it changes
nothing. (A kernel that defragments for advised regions, `defrag` = `madvise`, the
default, may compact memory at such a fault when free memory is fragmented: glibc's
`hugetlb` tunable asks the same of the kernel for every allocation.)
"""

from __future__ import annotations

import ctypes
import mmap

# Bodies up to this grow as a plain bytearray (form fields, JSON, small latents).
SMALL_BODY_BYTES = 1 << 20
# Above glibc's largest mmap threshold (32 MiB, also what vaecast.pipeline.heap sets), so the
# buffer is a mapping of its own; only the pages written count in RSS.
MAPPED_ROOM_BYTES = 33 << 20

_resize = ctypes.pythonapi.PyByteArray_Resize
_resize.argtypes = (ctypes.py_object, ctypes.c_ssize_t)
_resize.restype = ctypes.c_int  # ctypes.pythonapi raises the MemoryError it sets

MADV_HUGEPAGE = 14  # madvise(2), Linux
PAGE_BYTES = mmap.PAGESIZE
try:
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    _madvise.restype = ctypes.c_int
except (OSError, AttributeError):  # no such call here: the room stays in small pages
    _madvise = None


class BodyBuffer:
    """Appends chunks; `take()` returns the body as one `bytearray`."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._size = 0  # bytes of body; past a small body, len(_data) is the room
        self._mapped = False

    def __len__(self) -> int:
        return self._size

    def append(self, chunk: bytes) -> None:
        end = self._size + len(chunk)
        if not self._mapped:
            if end <= SMALL_BODY_BYTES:
                self._data += chunk
                self._size = end
                return
            self._move_to_mapping(end)
        elif end > len(self._data):
            # A mapping grows by mremap: the room costs address space, not memory.
            _resize(self._data, max(end, len(self._data) * 3 // 2))
            # Advised again: glibc may have moved it to a new mapping (seen in a
            # long-lived process) instead of growing it in place.
            advise_huge_pages(self._data)
        with memoryview(self._data) as view:
            view[self._size : end] = chunk
        self._size = end

    def take(self) -> bytearray:
        """The body, cut to its size; the buffer is empty afterwards."""
        data, self._data = self._data, bytearray()
        if len(data) != self._size:
            _resize(data, self._size)
        self._size, self._mapped = 0, False
        return data

    def _move_to_mapping(self, needed: int) -> None:
        small, self._data = self._data, bytearray()
        _resize(self._data, max(needed, MAPPED_ROOM_BYTES))
        advise_huge_pages(self._data)  # before the first write
        with memoryview(self._data) as view:
            view[: self._size] = small
        self._mapped = True


def advise_huge_pages(data: bytearray) -> bool:
    """Ask for transparent huge pages over every page `data` touches; whether the kernel
    took the advice (False where it has no huge pages, or no madvise).

    `data` must be a mapping of its own (the room: glibc maps a block this size alone),
    since the first and last pages are advised whole: they hold glibc's block header
    and the end of the mapping, nothing else. Advising only the whole pages inside the
    buffer would split the mapping in two with different flags, and a mapping in two
    pieces cannot grow by mremap: glibc would copy the body into a new, unadvised one.
    """
    if _madvise is None or not data:
        return False
    address = _address_of(data)
    start = address // PAGE_BYTES * PAGE_BYTES  # madvise wants a page-aligned start
    end = -(-(address + len(data)) // PAGE_BYTES) * PAGE_BYTES
    return _madvise(start, end - start, MADV_HUGEPAGE) == 0


def _address_of(data: bytearray) -> int:
    # The ctypes view exports the buffer only while it lives: here, not past the return
    # (an export would make the next resize raise BufferError).
    return ctypes.addressof(ctypes.c_char.from_buffer(data))
