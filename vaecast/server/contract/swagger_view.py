"""The document as OpenAPI 3.0, for the bundled Swagger UI (4.x renders 3.0 only).

Only what 3.0 spells differently changes: `null` in a union becomes `nullable`,
`const` a one-value `enum`, `contentMediaType` of bytes the `binary` format
(`contentSchema` is dropped), and `info` loses the fields 3.0 lacks, as the document
loses its `webhooks` (3.1's; the 3.1 document at /openapi.json has them). The 3.1
document stays the contract; this is a view of it, made from it on each build. Pure.
"""

from __future__ import annotations

from typing import Any

SWAGGER_OPENAPI_VERSION = "3.0.3"
NULL = {"type": "null"}
# A string of these media types is text, not bytes.
TEXTUAL = ("application/json", "text/")


def swagger_ui_view(document: dict[str, Any]) -> dict[str, Any]:
    view = _convert(document)
    view["openapi"] = SWAGGER_OPENAPI_VERSION
    view.pop("webhooks", None)
    info = view["info"]
    info.pop("summary", None)
    info.get("license", {}).pop("identifier", None)
    return view


def _convert(value: Any) -> Any:
    if isinstance(value, list):
        return [_convert(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {key: _convert(item) for key, item in value.items()}
    for union in ("anyOf", "oneOf"):
        if union in out and NULL in out[union]:
            rest = [item for item in out.pop(union) if item != NULL]
            if len(rest) == 1 and "$ref" not in rest[0]:
                out.update(rest[0])
            elif len(rest) == 1:
                out["allOf"] = rest
            else:
                out[union] = rest
            out["nullable"] = True
    if "const" in out:
        out["enum"] = [out.pop("const")]
    out.pop("contentSchema", None)  # 3.0 has no schema for a string's content
    media_type = out.pop("contentMediaType", None)
    if media_type is not None and not media_type.startswith(TEXTUAL):
        out["format"] = "binary"
    return out
