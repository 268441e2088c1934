"""Reading latent tensors from uploaded bytes, safely.

Accepted: safetensors (tensor `latents`, optionally a soundtrack `audio`, and
`__metadata__` such as `fps` and `audio_sample_rate`) and NumPy `.npy` of any
floating dtype in either byte order, C or Fortran order (latents only). Pickles,
including `torch.save` files, are refused on sight: loading one can run arbitrary
code. The format is sniffed from the bytes, not trusted from a Content-Type, because
`curl --data-binary` labels everything `application/x-www-form-urlencoded`.

Sniffing goes by structure, most specific first: safetensors (`vaecast.safetensors_header`;
it comes before the pickle test, since a header length of 640 starts with the same
two bytes as a protocol-2 pickle), then the `.npy` magic, then pickles (PROTO, 0x80,
followed by protocol 2..5) and zip archives (torch.save), which are refused.

Both headers are read with bounded cost (`safetensors_format`, `npy_format`), and the
declared dtype and shape of `latents` are checked (`latents`) before any tensor data
is touched: a file whose latents are too big for the caller is refused (by
`check_shape`) before it is converted to float32 or scanned for NaN. The result is a
finite float32 BCTHW tensor with batch 1. The soundtrack is checked by `check_audio`
(`audio`).

Errors, each with a message that tells the user what to send:
- 415 `UnsupportedMediaError`: not safetensors or `.npy`; a pickle or torch.save file;
  a corrupt file (truncated header, data that does not match the declared shape and
  dtype, a header past the size and complexity bounds); a `.npy` dtype that is not a
  plain number (objects need pickle; structured arrays are not read).
- 422 `InvalidRequestError`: an empty upload; no `latents` tensor; latents that are not
  floating point (or of a safetensors float type torch lacks, such as F4), not CTHW or
  BCTHW, of batch > 1, empty, or NaN/infinite; a sample rate that is not a few digits.
- whatever `check_shape` raises, unchanged.
"""

from __future__ import annotations

from vaecast.errors import InvalidRequestError, UnsupportedMediaError
from vaecast.latent_files.audio import AUDIO_KEY, AUDIO_RATE_KEY, MAX_AUDIO_CHANNELS, check_audio
from vaecast.latent_files.latents import (
    LATENTS,
    LATENTS_KEY,
    SAFE_HINT,
    Buffer,
    LatentFile,
    LayoutChoice,
    ShapeCheck,
    TensorRole,
)
from vaecast.latent_files.npy_format import NPY_MAGIC, load_npy
from vaecast.latent_files.safetensors_format import load_safetensors
from vaecast.safetensors_header import read_header

__all__ = [
    "AUDIO_KEY",
    "AUDIO_RATE_KEY",
    "LATENTS_KEY",
    "MAX_AUDIO_CHANNELS",
    "LatentFile",
    "LayoutChoice",
    "ShapeCheck",
    "check_audio",
    "load_latents",
]

_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default format is a zip of pickles
_PICKLE_PROTO = 0x80  # pickle protocols 2 to 5 start with PROTO and the protocol number
_PICKLE_PROTOCOLS = range(2, 6)
_PICKLE_REFUSED = (
    f"pickle and torch.save files are refused (loading them can run code); {SAFE_HINT}"
)


def load_latents(
    data: Buffer,
    check_shape: ShapeCheck | None = None,
    layout: LayoutChoice | None = None,
    role: TensorRole = LATENTS,
    max_batch: int = 1,
) -> LatentFile:
    """Parse and check an uploaded latent file; see the module docstring.

    `check_shape` gets the declared latents shape as BCTHW after the dtype, rank and
    batch checks and before any latents data is converted or scanned; what it raises
    propagates unchanged (the server refuses videos over its frame and pixel limits).

    `layout` picks, from the file's metadata, the layout the latents are read in
    (`vaecast.models.layouts`: a pipeline's own, such as LTX's packed tokens); the
    shape checks and `check_shape` see the BCTHW it makes. Without it: CTHW or BCTHW.

    `role` is what the file carries: latents (a float tensor `latents`), or frames a
    producer decoded itself (`vaecast.latent_files.frames`). `max_batch` above 1 takes
    a batch of that many videos at most (B jobs, one per entry); `check_shape` then
    sees one entry's shape.

    From a `bytearray` the latents may be a view of it, not a copy (an upload is then
    held once): the caller hands the buffer over and must not write to it afterwards.
    From `bytes` they are always a copy.
    """
    if not data:
        raise InvalidRequestError(f"the upload is empty; {SAFE_HINT}")
    header = read_header(data)
    if header is not None:
        return load_safetensors(data, header, check_shape, layout, role, max_batch)
    if data.startswith(NPY_MAGIC):
        return load_npy(data, check_shape, layout, role, max_batch)
    if data.startswith(_ZIP_MAGIC) or (
        data[0] == _PICKLE_PROTO and len(data) > 1 and data[1] in _PICKLE_PROTOCOLS
    ):
        raise UnsupportedMediaError(_PICKLE_REFUSED)
    raise UnsupportedMediaError(f"the upload is not a safetensors or .npy file; {SAFE_HINT}")
