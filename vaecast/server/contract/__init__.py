"""The API's contract: typed models, an operation record per handler, and the OpenAPI
3.1 document made from the app's own router (`openapi_document`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from vaecast.server.contract.spec import Header, Param, Reply, operation

__all__ = ["Header", "Param", "Reply", "openapi_document", "operation"]


def openapi_document(app: web.Application) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `app` (`vaecast.server.app.default_app()` is the app
    `vaecast serve` makes with its default configuration). What the docs site renders
    and `/openapi.json` serves."""
    from vaecast.server.contract.document import openapi_document as document_of

    return document_of(app)
