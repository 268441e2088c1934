"""What one HTTP operation promises, as a record on its handler: /openapi.json's source.

A handler says what it takes and answers with `@operation(...)` where it is defined
(vaecast.server.faces.*); `vaecast.server.contract.document` walks the app's router
and reads these records, so a route and its description are one definition. Schemas
are msgspec Struct types (vaecast.server.contract.models, made into JSON Schema
2020-12 components) or plain JSON Schema dicts for what is not JSON (a file, a
playlist). Errors are named by their class (vaecast.errors), so a status and its
`type` are the ones the edge really sends. No aiohttp here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from vaecast.errors import VaecastError

# A JSON Schema: a Struct type (a component) or a schema written out.
Schema = type | Mapping[str, Any]
ATTRIBUTE = "__vaecast_operation__"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Param:
    """A path, query or header parameter (path parameters are always required)."""

    name: str
    where: Literal["path", "query", "header"]
    schema: Schema
    description: str
    required: bool = False


@dataclass(frozen=True, slots=True)
class Header:
    """A response header."""

    description: str
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = False  # sent with every answer of its status


@dataclass(frozen=True, slots=True)
class Reply:
    """A success (or non-error) answer: its status, its bodies by media type, its headers."""

    status: int
    description: str
    content: Mapping[str, Schema] = field(default_factory=dict)
    headers: Mapping[str, Header] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ErrorType:
    """An error the edge answers that no VaecastError class names (aiohttp's, a 416)."""

    status: int
    type: str
    headers: Mapping[str, Header] = field(default_factory=dict)


Refusal = type[VaecastError] | ErrorType


@dataclass(frozen=True, slots=True)
class Operation:
    """One method of one route. `errors` are the refusals the handler itself can make;
    the edge's (Host, Origin, API key, 500) are added by the document from the route."""

    summary: str
    tag: str
    replies: tuple[Reply, ...]
    params: tuple[Param, ...] = ()
    body: Mapping[str, Schema] | None = None
    body_required: bool = True
    errors: tuple[Refusal, ...] = ()
    description: str | None = None
    # Credentials beyond the server's API key (a push session's token).
    extra_security: tuple[str, ...] = ()


def operation(
    summary: str,
    *,
    tag: str,
    replies: tuple[Reply, ...],
    params: tuple[Param, ...] = (),
    body: Mapping[str, Schema] | None = None,
    body_required: bool = True,
    errors: tuple[Refusal, ...] = (),
    description: str | None = None,
    extra_security: tuple[str, ...] = (),
) -> Callable[[F], F]:
    """Attach the operation a handler serves; the handler is returned unchanged."""
    spec = Operation(
        summary,
        tag,
        replies,
        params,
        body,
        body_required,
        errors,
        description,
        extra_security,
    )

    def attach(handler: F) -> F:
        setattr(handler, ATTRIBUTE, spec)
        return handler

    return attach


def operation_of(handler: Callable[..., Any]) -> Operation | None:
    return getattr(handler, ATTRIBUTE, None)


# What `not_a_route` attaches: the document leaves the route out.
NOT_A_ROUTE = Operation("not a route", "none", ())


def not_a_route(handler: F) -> F:
    """A handler that only refuses methods a path lacks (405 with its `Allow`): not an
    operation, so absent from the document, where such a method is a 405 anyway."""
    setattr(handler, ATTRIBUTE, NOT_A_ROUTE)
    return handler


def refusal_of(error: Refusal) -> ErrorType:
    if isinstance(error, ErrorType):
        return error
    return ErrorType(error.status, error.type)
