"""Whether a preview decoder takes a model's latents: the check behind `"preview"`.

A job with a preview (`"preview": "taehv"`) decodes the same latents with two
decoders, so both must read them alike. What a decoder declares is all there is to
go by: its latent channels, its geometry (the frames and size a latent shape decodes
to) and its `latent_space`, the name of the latent space it was trained on. A
decoder without that attribute has its own space, named by its model name (two
different VAEs never share latents by accident). A decoder whose space its weights
decide, or that takes any latents of its geometry, declares `latent_space = None`:
`linear` (parameter-free) and `taehv` (a file for Wan 2.1 or for HunyuanVideo). A
plugin decoder trained on Wan 2.1's latents declares `latent_space = "wan2.1"`.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from vaecast.errors import InvalidRequestError, VaecastError
from vaecast.models.base import ChunkedDecoder

# A shape every built-in decoder plans: 5 latent frames of 32x32 (the LTX family's
# 32x spatial scale included), for the check before any latents exist.
PROBE_FRAMES, PROBE_SIZE = 5, 32


def latent_space(decoder: ChunkedDecoder) -> str | None:
    """The latent space `decoder` reads; None: any of its geometry."""
    return getattr(decoder, "latent_space", decoder.name)


def check_preview(
    final: ChunkedDecoder, preview: ChunkedDecoder, latent_shape: Sequence[int] | None = None
) -> None:
    """Raise a 422 naming both decoders unless `preview` reads `final`'s latents and
    decodes them to the same frames and size (of `latent_shape`, or a probe shape)."""
    why = _mismatch(final, preview, latent_shape)
    if why is not None:
        raise InvalidRequestError(
            f"the preview decoder {preview.name!r} cannot preview model {final.name!r}: {why}"
        )


def _mismatch(
    final: ChunkedDecoder, preview: ChunkedDecoder, latent_shape: Sequence[int] | None
) -> str | None:
    if preview.latent_channels != final.latent_channels:
        return (
            f"it takes {preview.latent_channels} latent channels, the model {final.latent_channels}"
        )
    spaces = latent_space(final), latent_space(preview)
    if None not in spaces and spaces[0] != spaces[1]:
        return f"it reads {spaces[1]}'s latent space, the model {spaces[0]}'s"
    shape = latent_shape or (1, final.latent_channels, PROBE_FRAMES, PROBE_SIZE, PROBE_SIZE)
    try:
        wanted = final.plan(shape)
    except VaecastError:
        return None  # not a shape the model takes: its own check says so
    try:
        got = preview.plan(shape)
    except VaecastError as error:
        return f"it cannot take latents of shape {tuple(shape)}: {error.message}"
    if (got.frames, got.width, got.height) != (wanted.frames, wanted.width, wanted.height):
        return (
            f"it decodes {tuple(shape)} to {got.frames} frames of {got.width}x{got.height}, "
            f"the model to {wanted.frames} of {wanted.width}x{wanted.height}"
        )
    return None
