"""The documentation site's generated pages (docs/hooks/): the HTTP reference from an
OpenAPI document and the CLI reference from a parser, each a pure function tested on
small inputs; the CLI page never shows a default read from the builder's environment."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from vaecast.cli.help import DefaultsShown

HOOKS = Path(__file__).resolve().parents[1] / "docs" / "hooks"


def hook(name: str) -> ModuleType:
    """A hook module, loaded from its file as MkDocs loads it (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DOCUMENT = {
    "openapi": "3.1.0",
    "info": {"title": "vaecast", "version": "9.9.9"},
    "tags": [{"name": "videos", "description": "Jobs"}],
    "paths": {
        "/v1/videos/{video_id}": {
            "parameters": [
                {"name": "video_id", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "get": {
                "tags": ["videos"],
                "summary": "A job",
                "responses": {
                    "200": {
                        "description": "the job",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Job"}}
                        },
                    },
                    "404": {"$ref": "#/components/responses/NotFound"},
                    "410": {
                        "description": "Gone: deleted",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "allOf": [
                                        {"$ref": "#/components/schemas/Job"},
                                        {"type": "object", "properties": {"x": {"const": 1}}},
                                    ]
                                }
                            }
                        },
                    },
                },
            },
            "delete": {
                "tags": ["videos"],
                "summary": "Cancel | delete",
                "security": [{"apiKey": []}, {}],
                "requestBody": {
                    "required": False,
                    "content": {
                        "application/x-npy": {
                            "schema": {"type": "string", "description": "an array"}
                        }
                    },
                },
                "responses": {"204": {"description": "gone"}},
            },
        },
        "/healthz": {"get": {"summary": "Health", "responses": {"200": {"description": "ok"}}}},
    },
    "components": {
        "schemas": {
            "Job": {
                "type": "object",
                "required": ["id"],
                "properties": {
                    "id": {"type": "string"},
                    "status": {"enum": ["queued", "running"]},
                    "fps": {"type": ["number", "null"]},
                },
            }
        },
        "responses": {
            "NotFound": {
                "description": "no such job",
                "headers": {"X-Why": {"schema": {"type": "string"}}},
            }
        },
    },
}


def test_the_http_reference_lists_each_operation_and_schema():
    page = hook("http_reference").render_http_reference(DOCUMENT)
    lines = page.splitlines()
    assert "vaecast 9.9.9, generated from the server's OpenAPI 3.1.0 document" in page
    routes = lines[lines.index("## Routes") + 4 : lines.index("## Routes") + 7]
    assert routes == [
        "| `GET` | `/v1/videos/{video_id}` | A job |",
        "| `DELETE` | `/v1/videos/{video_id}` | Cancel \\| delete |",
        "| `GET` | `/healthz` | Health |",
    ]
    # Grouped by tag, an untagged operation under "Other"; shared path parameters shown.
    assert lines.index("## videos") < lines.index("### `GET /v1/videos/{video_id}`")
    assert lines.index("## Other") < lines.index("### `GET /healthz`")
    assert "| `video_id` | path | yes | `string` |  |" in lines
    assert "| 200 | the job | `application/json` [Job](#schema-job) |  |" in lines
    assert "| 404 | no such job |  | `X-Why` |" in lines  # a $ref'd response, resolved
    assert "| 410 | Gone: deleted | `application/json` [Job](#schema-job) |  |" in lines
    assert "Request body (optional)." in lines
    assert "| `application/x-npy` | `string` | an array |" in lines
    assert "Credentials: `apiKey`." in lines and "Open without credentials too." in lines
    assert "### Job {#schema-job}" in lines
    assert '| `status` | one of `"queued"`, `"running"` |  |  |' in lines
    assert "| `fps` | `number` or `null` |  |  |" in lines
    assert "| `id` | `string` | yes |  |" in lines


def test_the_cli_reference_shows_defaults_and_environment_variables():
    parser = argparse.ArgumentParser(
        prog="tool", description="a tool", formatter_class=DefaultsShown
    )
    parser.add_argument("--debug", action="store_true", help="tracebacks")
    commands = parser.add_subparsers(metavar="COMMAND")
    run = commands.add_parser("run", help="run it", formatter_class=DefaultsShown)
    run.add_argument("file", help="what to run")
    run.add_argument("--port", type=int, default=8000, help="0 picks one (env TOOL_PORT)")
    run.add_argument("--mode", choices=("a", "b"), default="a", help="how: %(choices)s")
    page = hook("cli_reference").render_cli_reference(parser)
    lines = page.splitlines()
    assert lines[lines.index("## `tool`") + 2] == "A tool."
    assert "| `--debug` |  |  | tracebacks |" in lines
    assert lines[lines.index("## `tool run`") + 2] == "Run it."
    assert "| `file` | what to run |" in lines
    assert "| `--port PORT` | `8000` |  | 0 picks one (env TOOL_PORT) |" in lines
    assert "| `--mode {a,b}` | `a` |  | how: a, b |" in lines
    # The top-level parser lists no positional table for its commands.
    assert lines.count("| argument | what it is |") == 1


def test_the_cli_page_shows_the_codes_defaults_not_the_builders(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VAECAST_PORT", "9999")
    monkeypatch.setenv("VAECAST_API_KEY", "builder-secret")
    page = hook("cli_reference").cli_reference()
    assert "builder-secret" not in page and "9999" not in page
    assert "| `--port PORT` | `8000` | `VAECAST_PORT` | 0 picks a free port |" in page
