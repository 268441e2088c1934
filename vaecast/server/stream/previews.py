"""Which preview decoder a new job gets, and the threads previews decode on.

A job names its preview (`"preview": "taehv"`, `"none"` for none), or gets its
model's default (`--preview wan2.1=taehv`, `ServerConfig.previews`). The decoders a
preview may name are the served models and `linear`, on the model's device, or
with `--preview-device` those loaded there. A preview that does not read its model's
latents is refused with a 422 naming both (`vaecast.models.latent_space`).

Previews decode on threads of their own (a push session's preview waits there for
its blocks), made at the first job with one; they encode on the manager's threads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from vaecast.errors import InvalidRequestError, UnknownModelError
from vaecast.models.base import ChunkedDecoder
from vaecast.models.latent_space import check_preview
from vaecast.models.linear import LinearDecoder
from vaecast.pipeline.run import Workers
from vaecast.server.config import ServerConfig
from vaecast.server.stream.job_requests import (
    NO_PREVIEW,
    DecodeRequest,
    PushKind,
    PushRequest,
)


class Previews:
    """One server's preview decoders (see the module docstring)."""

    def __init__(
        self,
        config: ServerConfig,
        decoders: Mapping[str, ChunkedDecoder],
        preview_decoders: Mapping[str, ChunkedDecoder] | None,
    ) -> None:
        self._config = config
        self._decoders = decoders
        self.decoders = (
            dict(preview_decoders)
            if preview_decoders is not None
            else {LinearDecoder.name: LinearDecoder(config.device), **decoders}
        )
        self._workers: Workers | None = None

    def workers(self, like: Workers) -> Workers:
        """The previews' threads: a decode pool of their own, `like`'s encode pools."""
        if self._workers is None:
            pool = ThreadPoolExecutor(
                self._config.decode_slots, thread_name_prefix="vaecast-preview"
            )
            self._workers = dataclasses.replace(like, decode=pool)
        return self._workers

    def shutdown(self) -> None:
        if self._workers is not None:
            self._workers.decode.shutdown()

    def check_defaults(self) -> None:
        """Each `--preview MODEL=DECODER` names decoders that share a latent space (at
        start: a mistake is one line, before the port opens)."""
        for model, name in self._config.previews:
            check_preview(self._served(model), self._decoder(name))

    def check_name(self, name: str | None) -> None:
        """A request's preview, by name, is a decoder served here (or none): 404 first,
        before anything costly is done for the request."""
        if name is not None and name != NO_PREVIEW:
            self._decoder(name)

    def preview_for(
        self, request: DecodeRequest | PushRequest, decoder: ChunkedDecoder
    ) -> ChunkedDecoder | None:
        """The preview decoder of a new job of `decoder`: the request's, or the
        server's default for its model; None for none."""
        name = request.preview
        if name is None:
            name = dict(self._config.previews).get(request.model)
        if name is None or name == NO_PREVIEW:
            return None
        if isinstance(request, PushRequest) and request.kind is PushKind.FRAMES:
            if request.preview is None:
                return None
            raise InvalidRequestError("a frames session decodes nothing: it takes no preview")
        preview = self._decoder(name)
        shape = tuple(request.latents.shape) if isinstance(request, DecodeRequest) else None
        check_preview(decoder, preview, shape)
        return preview

    def _served(self, model: str) -> ChunkedDecoder:
        try:
            return self._decoders[model]
        except KeyError:
            raise UnknownModelError(f"--preview: model {model!r} is not served here") from None

    def _decoder(self, name: str) -> ChunkedDecoder:
        try:
            return self.decoders[name]
        except KeyError:
            known = ", ".join(sorted(self.decoders))
            raise UnknownModelError(
                f"preview decoder {name!r} is not served here; a preview may be: {known} "
                "(a --model of the server, or linear)"
            ) from None
