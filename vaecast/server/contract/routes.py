"""`GET /openapi.json` (the contract) and `GET /docs` (it, rendered for people).

/docs is Swagger UI from the `swagger-ui-bundle` package, served from this app with
a Content-Security-Policy that allows nothing from elsewhere: its script, style and
icons come from `/docs/assets/`, and it reads the document from `/docs/openapi-3.0.json`
(the same document in the OpenAPI version that Swagger UI 4 renders). Both are open
without the API key (vaecast.server.edge.security): they show the API, not its data.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import swagger_ui_bundle
from aiohttp import web

from vaecast.errors import NotFoundError
from vaecast.server.contract.document import openapi_document
from vaecast.server.contract.shared import JSON
from vaecast.server.contract.spec import Header, Param, Reply, operation
from vaecast.server.contract.swagger_view import swagger_ui_view

SWAGGER_DIR = Path(swagger_ui_bundle.swagger_ui_path)
# The bundle's files the page loads, by name, and the page's own script.
ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "favicon-32x32.png": "image/png",
    "favicon-16x16.png": "image/png",
}
INIT_SCRIPT = "vaecast-docs.js"
# Nothing from another origin; Swagger UI sets style attributes and uses data: icons.
DOCS_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
# Relative URLs: the page works behind a proxy that serves it under a prefix.
DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>vaecast API reference</title>
  <link rel="icon" type="image/png" href="docs/assets/favicon-32x32.png">
  <link rel="stylesheet" href="docs/assets/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="docs/assets/swagger-ui-bundle.js"></script>
  <script src="docs/assets/vaecast-docs.js"></script>
</body>
</html>
"""
DOCS_SCRIPT = """window.ui = SwaggerUIBundle({
  url: "docs/openapi-3.0.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
"""
HTML = "text/html"
JS = "text/javascript"
ANY_OBJECT = {"type": "object"}


Documents = tuple[dict[str, Any], dict[str, Any]]


class _Documents:
    """The app's document and its 3.0 view, made on first request (the router is final
    by then) and kept: they depend on nothing that changes while the app runs. Made in
    a thread (some 20 ms of schema generation), once, whoever asks meanwhile."""

    def __init__(self) -> None:
        self._built: asyncio.Future[Documents] | None = None

    async def get(self, app: web.Application) -> Documents:
        if self._built is None:
            self._built = asyncio.ensure_future(asyncio.to_thread(_build, app))
        return await asyncio.shield(self._built)


def _build(app: web.Application) -> Documents:
    document = openapi_document(app)
    return document, swagger_ui_view(document)


DOCUMENTS = web.AppKey("openapi_documents", _Documents)


def add_contract_routes(app: web.Application) -> None:
    app[DOCUMENTS] = _Documents()
    app.router.add_get("/openapi.json", openapi_json)
    app.router.add_get("/docs", docs_page)
    app.router.add_get("/docs/openapi-3.0.json", swagger_document)
    app.router.add_get("/docs/assets/{name}", docs_asset)


@operation(
    "This API's OpenAPI 3.1 document",
    tag="server",
    replies=(Reply(200, "the document", {JSON: ANY_OBJECT}),),
)
async def openapi_json(request: web.Request) -> web.Response:
    document, _ = await request.app[DOCUMENTS].get(request.app)
    return web.json_response(document, headers={"Cache-Control": "no-cache"})


@operation(
    "The same document as OpenAPI 3.0, for the bundled Swagger UI",
    tag="server",
    replies=(Reply(200, "the document, in OpenAPI 3.0", {JSON: ANY_OBJECT}),),
)
async def swagger_document(request: web.Request) -> web.Response:
    _, view = await request.app[DOCUMENTS].get(request.app)
    return web.json_response(view, headers={"Cache-Control": "no-cache"})


@operation(
    "The API reference, for people (Swagger UI, served from here)",
    tag="server",
    replies=(
        Reply(
            200,
            "the page",
            {HTML: {"type": "string"}},
            {"Content-Security-Policy": Header("nothing is loaded from another origin")},
        ),
    ),
)
async def docs_page(request: web.Request) -> web.Response:
    return web.Response(
        text=DOCS_PAGE,
        content_type=HTML,
        headers={"Content-Security-Policy": DOCS_CSP, "Cache-Control": "no-cache"},
    )


@operation(
    "A file of the API reference page",
    tag="server",
    params=(
        Param(
            "name",
            "path",
            {"type": "string", "enum": sorted([*ASSETS, INIT_SCRIPT])},
            "the file's name",
            required=True,
        ),
    ),
    replies=(
        Reply(
            200,
            "the file",
            {"text/css": {"type": "string"}, JS: {"type": "string"}, "image/png": {}},
        ),
    ),
    errors=(NotFoundError,),
)
async def docs_asset(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    if name == INIT_SCRIPT:
        return web.Response(text=DOCS_SCRIPT, content_type=JS, headers=headers)
    if name not in ASSETS:
        raise NotFoundError(f"no API reference file {name[:80]!r}")
    media = ASSETS[name]
    charset = "" if media.startswith("image/") else "; charset=utf-8"
    headers["Content-Type"] = media + charset
    # FileResponse stats and reads in a thread.
    return web.FileResponse(SWAGGER_DIR / name, headers=headers)
