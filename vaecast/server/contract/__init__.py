"""The API's contract: typed models, an operation record per handler, and the OpenAPI
3.1 document made from the app's own router (`openapi_document`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from vaecast.server.contract.spec import Header, Param, Reply, operation

__all__ = ["Header", "Param", "Reply", "openapi_document", "operation"]


def openapi_document(app: web.Application | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `app`, by default of the app `vaecast serve` makes
    with its default configuration (built, never started: no model is loaded, no port
    opened). What the docs site renders and `/openapi.json` serves."""
    from vaecast.server.contract.document import openapi_document as document_of

    if app is None:
        app = default_app()
    return document_of(app)


def default_app() -> web.Application:
    """The app of the default configuration; its decoders are stand-ins, which only
    `create_app`'s check of the default model's name ever looks at before a start."""
    # Imported here: the app imports the faces, which import this package's records.
    from vaecast.models.linear import LinearDecoder
    from vaecast.server.app import create_app
    from vaecast.server.config import ServerConfig

    config = ServerConfig()
    return create_app(config, {config.default_model: LinearDecoder()})
