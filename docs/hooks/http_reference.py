"""MkDocs hook: the HTTP reference page, rendered from the server's OpenAPI document at
build time (`vaecast.server.contract.openapi_document(app)`), never a checked-in copy.

`render_http_reference(document)` is pure (an OpenAPI 3.1 dict in, Markdown out): every
operation with its method, path, summary, parameters, request bodies and responses, then
the schemas. `on_files` adds the page as `reference/http.md` and the document itself as
`reference/openapi.json`, and warns (which fails `mkdocs build --strict`) about any route
of the real app's router that the document leaves out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

PAGE = "reference/http.md"
DOCUMENT = "reference/openapi.json"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
log = logging.getLogger("mkdocs.hooks.http_reference")

Json = Mapping[str, Any]


def render_http_reference(document: Json) -> str:
    info = document.get("info", {})
    lines = [
        "# HTTP reference",
        "",
        f"{info.get('title', 'vaecast')} {info.get('version', '')}, generated from the "
        f"server's OpenAPI {document.get('openapi', '3.1')} document when the site is built "
        "([openapi.json](openapi.json); a running server answers it too).",
        "",
    ]
    if info.get("description"):
        lines += [info["description"], ""]
    lines += ["## Routes", "", "| method | path | what it does |", "| --- | --- | --- |"]
    for method, path, op in operations(document):
        lines.append(f"| `{method.upper()}` | `{path}` | {_cell(op.get('summary', ''))} |")
    lines.append("")
    for tag, entries in _by_tag(document):
        lines += [f"## {tag['name']}", ""]
        if tag.get("description"):
            lines += [tag["description"], ""]
        for method, path, op, shared in entries:
            lines += _operation(document, method, path, op, shared)
    schemas = document.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
        for name, schema in schemas.items():
            lines += _schema_section(document, name, schema)
    return "\n".join(lines)


def operations(document: Json) -> Iterator[tuple[str, str, Json]]:
    """(method, path, operation) for each operation, in the document's order."""
    for path, item in document.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                yield method, path, item[method]


def _by_tag(document: Json) -> list[tuple[Json, list[tuple[str, str, Json, list[Json]]]]]:
    tags: dict[str, Json] = {tag["name"]: tag for tag in document.get("tags", [])}
    grouped: dict[str, list[tuple[str, str, Json, list[Json]]]] = {name: [] for name in tags}
    for path, item in document.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                op = item[method]
                tag = (op.get("tags") or ["Other"])[0]
                tags.setdefault(tag, {"name": tag})
                grouped.setdefault(tag, []).append((method, path, op, item.get("parameters", [])))
    return [(tags[name], entries) for name, entries in grouped.items() if entries]


def _operation(document: Json, method: str, path: str, op: Json, shared: list[Json]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        lines += [f"**{op['summary']}**", ""]
    if op.get("description"):
        lines += [op["description"], ""]
    security = op.get("security", document.get("security"))
    if security:
        schemes = sorted({name for requirement in security for name in requirement})
        if schemes:
            lines += ["Credentials: " + ", ".join(f"`{name}`" for name in schemes) + ".", ""]
        if {} in security:
            lines += ["Open without credentials too.", ""]
    parameters = [_resolve(document, p) for p in (*shared, *op.get("parameters", []))]
    if parameters:
        lines += ["| parameter | in | required | type | description |"]
        lines += ["| --- | --- | --- | --- | --- |"]
        for parameter in parameters:
            required = "yes" if parameter.get("required") else ""
            lines.append(
                f"| `{parameter['name']}` | {parameter.get('in', '')} | {required} "
                f"| {_type(document, parameter.get('schema', {}))} "
                f"| {_cell(parameter.get('description', ''))} |"
            )
        lines.append("")
    body = op.get("requestBody")
    if body is not None:
        body = _resolve(document, body)
        required = " (required)" if body.get("required") else " (optional)"
        said = _cell(body.get("description", ""))
        lines += [f"Request body{required}" + (f": {said}" if said else "."), ""]
        lines += ["| media type | schema | description |", "| --- | --- | --- |"]
        for media, content in body.get("content", {}).items():
            schema = content.get("schema", {})
            lines.append(
                f"| `{media}` | {_type(document, schema)} "
                f"| {_cell(schema.get('description', ''))} |"
            )
        lines.append("")
    responses = op.get("responses", {})
    if responses:
        lines += ["| status | meaning | body | headers |", "| --- | --- | --- | --- |"]
        for status, response in responses.items():
            response = _resolve(document, response)
            bodies = ", ".join(
                f"`{media}` {_type(document, content.get('schema', {}))}".strip()
                for media, content in response.get("content", {}).items()
            )
            headers = ", ".join(f"`{name}`" for name in response.get("headers", {}))
            lines.append(
                f"| {status} | {_cell(response.get('description', ''))} | {bodies} | {headers} |"
            )
        lines.append("")
    return lines


def _schema_section(document: Json, name: str, schema: Json) -> list[str]:
    lines = [f"### {name} {{#{_anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [_cell(schema["description"]), ""]
    properties = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", []))
        lines += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
        for field, value in properties.items():
            lines.append(
                f"| `{field}` | {_type(document, value)} | {'yes' if field in required else ''} "
                f"| {_cell(value.get('description', ''))} |"
            )
        lines.append("")
    else:
        lines += [f"Type: {_type(document, schema)}.", ""]
    return lines


def _type(document: Json, schema: Json) -> str:
    """A schema in a few words: a component as a link, arrays and unions spelt out."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name in document.get("components", {}).get("schemas", {}):
            return f"[{name}](#{_anchor(name)})"
        return f"`{name}`"
    for union in ("oneOf", "anyOf"):
        if union in schema:
            return " or ".join(_type(document, part) for part in schema[union])
    if "allOf" in schema:
        # A component narrowed by inline parts (an error body of one `type`): the
        # component names it; the narrowing is in the response's description.
        parts = [part for part in schema["allOf"] if "$ref" in part] or schema["allOf"]
        return " and ".join(_type(document, part) for part in parts)
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(_type(document, {**schema, "type": part}) for part in kind)
    if kind == "array":
        return "array of " + _type(document, schema.get("items", {}))
    if kind is None:
        return "any"
    text = f"`{kind}`"
    if "format" in schema:
        text += f" ({schema['format']})"
    return text


def _resolve(document: Json, value: Json) -> Json:
    """`value`, or what its local `$ref` ("#/components/...") points at."""
    while (
        "$ref" in value
        and value["$ref"].startswith("#/components/")
        and (not value["$ref"].startswith("#/components/schemas/"))
    ):
        target: Any = document
        for part in value["$ref"][2:].split("/"):
            target = target[part]
        value = target
    return value


def _anchor(name: str) -> str:
    return "schema-" + "".join(c if c.isalnum() else "-" for c in name).lower()


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def served_app() -> Any:
    """The app `vaecast serve` would run, on the parameter-free `linear` decoder: its
    router is the one the document and the reference are checked against."""
    from vaecast.models.registry import get_decoder
    from vaecast.server.app import create_app
    from vaecast.server.config import ServerConfig

    decoders = {"linear": get_decoder("linear", device="cpu", weights=None)}
    return create_app(ServerConfig(default_model="linear"), decoders)


def router_routes(app: Any) -> set[tuple[str, str]]:
    """(method, path) of every route of `app`, HEAD aside (aiohttp's twin of each GET),
    and the handlers that only refuse the methods a path lacks (`not_a_route`)."""
    from vaecast.server.contract.spec import NOT_A_ROUTE, operation_of

    return {
        (route.method, resource.canonical)
        for resource in app.router.resources()
        for route in resource
        if route.method != "HEAD" and operation_of(route.handler) is not NOT_A_ROUTE
    }


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    # Imported only when the site is built: the hook must load without the server.
    from vaecast.server.contract import openapi_document

    app = served_app()
    document = openapi_document(app)
    listed = {(method.upper(), path) for method, path, _ in operations(document)}
    for method, path in sorted(router_routes(app) - listed):
        log.warning("the OpenAPI document leaves out %s %s, a route of the app", method, path)
    files.append(File.generated(config, PAGE, content=render_http_reference(document)))
    text = json.dumps(document, indent=2) + "\n"
    files.append(File.generated(config, DOCUMENT, content=text))
    return files
