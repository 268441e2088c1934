"""Checking real answers against the OpenAPI document the server publishes.

`Contract(document).check(method, route, response, body)` fails unless the document
declares the answer's status for that route and method, its required headers are
there and valid, the answer's media type is declared for that status, and, for JSON,
unless the body validates against that schema (JSON Schema 2020-12, the document's
components resolvable by `$ref`).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import jsonschema
from jsonschema import Draft202012Validator


class Contract:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.checked: set[tuple[str, str, int]] = set()

    def response_of(self, method: str, route: str, status: int) -> dict[str, Any]:
        operation = self.document["paths"].get(route, {}).get(method.lower())
        assert operation is not None, f"{method} {route} is not in the document"
        response = operation["responses"].get(str(status))
        assert response is not None, (
            f"{method} {route} answered {status}, which the document does not declare "
            f"(it declares {sorted(operation['responses'])})"
        )
        return response

    def schema(self, method: str, route: str, status: int, media_type: str) -> dict[str, Any]:
        """The schema of that answer, as a root schema that resolves the document's `$ref`s."""
        content = self.response_of(method, route, status).get("content", {})
        assert media_type in content, (
            f"{method} {route} {status} is {media_type}; the document says {sorted(content)}"
        )
        return self.rooted(content[media_type]["schema"])

    def rooted(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": self.document["components"],
            **schema,
        }

    def component(self, name: str) -> dict[str, Any]:
        return self.rooted({"$ref": f"#/components/schemas/{name}"})

    def check(self, method: str, route: str, response: aiohttp.ClientResponse, body: bytes) -> Any:
        """Validate one answer; the JSON body (parsed) or None for other media types."""
        self.checked.add((method, route, response.status))
        media_type = response.content_type
        declared = self.response_of(method, route, response.status)
        for name, header in declared.get("headers", {}).items():
            if name in response.headers:
                validate(response.headers[name], header["schema"])
            else:
                assert not header.get("required"), f"{method} {route}: no {name} header"
        if method == "HEAD" or response.status in (204, 304):
            return None
        schema = self.schema(method, route, response.status, media_type)
        if media_type != "application/json":
            return None
        value = json.loads(body)
        validate(value, schema)
        return value


def validate(value: Any, schema: dict[str, Any]) -> None:
    """jsonschema's validation with its formats checked, the best error first."""
    error = jsonschema.exceptions.best_match(
        Draft202012Validator(
            schema, format_checker=Draft202012Validator.FORMAT_CHECKER
        ).iter_errors(value)
    )
    if error is not None:
        raise AssertionError(f"{error.message} at {list(error.absolute_path)}: {value!r:.500}")


def sse_events(text: str) -> list[dict[str, str]]:
    """The events of an event stream's text, each its fields (`event`, `id`, `data`)."""
    events = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if "data" in fields:
            events.append(fields)
    return events
