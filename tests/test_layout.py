"""The structure the code draws, checked: the server's wings never reach into the cluster,
the cluster composes the server's classes rather than subclassing them, modules stay short,
the job record stays pure, and the README stays a user's document."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vaecast"
MAX_MODULE_LINES = 600
# A function longer than this is several steps: each a function with a name.
MAX_FUNCTION_LINES = 80
MAX_README_LINES = 350
# The root holds what every part shares (errors, the version, pure rules and parsers);
# each family of modules is a package of its own (cli, client, pipeline, job, ...).
MAX_ROOT_MODULES = 10


def modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def imported(path: Path) -> Iterator[str]:
    """Every module `path` imports, at its top or inside a function (lazily)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


# What sits above the stream core: the faces, the face contract, the producers' wing,
# the jobs API and the app that puts them together.
ABOVE_THE_CORE = (
    "vaecast.server.faces",
    "vaecast.server.intake",
    "vaecast.server.api",
    "vaecast.server.app",
)


def _offenders(folder: Path, forbidden: tuple[str, ...]) -> set[str]:
    return {
        f"{path.relative_to(ROOT)}: {name}"
        for path in modules(folder)
        for name in imported(path)
        if name in forbidden or name.startswith(tuple(f"{f}." for f in forbidden))
    }


def test_the_server_imports_nothing_from_the_cluster() -> None:
    assert not _offenders(PACKAGE / "server", ("vaecast.cluster",))


def test_the_stream_core_and_the_api_document_import_no_face() -> None:
    """A job, its renditions, logs and fragment index know no delivery face (HLS,
    WHEP, the progressive MP4): the faces read the core, never the other way."""
    stream = _offenders(PACKAGE / "server" / "stream", ABOVE_THE_CORE)
    contract = _offenders(PACKAGE / "server" / "contract", ABOVE_THE_CORE)
    assert not stream | contract


def test_a_face_is_one_folder_that_imports_no_other_face() -> None:
    """Each face reads the core (and `faces.common`); none reaches into another, so a
    face is added or left out whole, with one entry in the config."""
    faces = PACKAGE / "server" / "faces"
    folders = sorted(p.name for p in faces.iterdir() if (p / "__init__.py").is_file())
    assert {"progressive", "hls", "whep"} <= set(folders)
    offenders = {
        offence
        for folder in folders
        for offence in _offenders(
            faces / folder,
            tuple(f"vaecast.server.faces.{other}" for other in folders if other != folder),
        )
    }
    assert not offenders


def test_benchmarks_and_the_chaos_suite_use_the_public_surface() -> None:
    """They run vaecast as users do (the CLI, HTTP, `vaecast.client`, `vaecast.embed`),
    so a change inside `vaecast.server` cannot break them."""
    offenders = _offenders(ROOT / "benchmarks", ("vaecast.server",))
    offenders |= _offenders(ROOT / "chaos", ("vaecast.server",))
    assert not offenders


def test_a_face_of_ones_own_needs_only_the_public_surface() -> None:
    """The tests' own face (tests/server/fragments_face) is written as a user's would
    be: against `vaecast.embed`, nothing under `vaecast.server`."""
    assert not _offenders(ROOT / "tests" / "server" / "fragments_face", ("vaecast.server",))


def test_no_import_cycle_in_the_package() -> None:
    """Modules as units, and folders as units, imports inside functions and under
    TYPE_CHECKING included: each graph is acyclic, so its layers are well defined and
    every import runs down them (tools/import_graph.py prints them)."""
    from tools.import_graph import measure

    for units in ("modules", "folders"):
        assert measure("vaecast", units)["cycles"] == [], units


def test_no_function_is_over_the_line_budget() -> None:
    long = {
        f"{path.relative_to(ROOT)}: {node.name} ({lines} lines)"
        for path in modules(PACKAGE)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES
    }
    assert not long, f"split these into named steps (at most {MAX_FUNCTION_LINES} lines each)"


def test_the_package_root_holds_few_modules() -> None:
    root = sorted(
        p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    assert len(root) <= MAX_ROOT_MODULES, root


def test_codecs_and_models_know_no_event_loop_and_no_server() -> None:
    """Media and model code is pure or threaded: no asyncio, aiohttp or server."""
    forbidden = ("asyncio", "aiohttp", "uvloop", "vaecast.server")
    assert not _offenders(PACKAGE / "codecs", forbidden) | _offenders(PACKAGE / "models", forbidden)


def test_no_cluster_class_subclasses_a_server_class() -> None:
    offenders = []
    for path in modules(PACKAGE / "cluster"):
        tree = ast.parse(path.read_text())
        from_server = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vaecast.server")
            for alias in node.names
        }
        server_modules = {
            alias.asname or alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
            if alias.name.startswith("vaecast.server")
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                root = base
                while isinstance(root, ast.Attribute):
                    root = root.value
                named = isinstance(root, ast.Name) and (
                    root.id in from_server or (root is not base and root.id in server_modules)
                )
                if named:
                    offenders.append(f"{path.relative_to(ROOT)}: {node.name}({ast.unparse(base)})")
    assert not offenders


def test_no_module_is_over_the_line_budget() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in modules(PACKAGE)
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these by concept (at most {MAX_MODULE_LINES} lines each)"


def test_the_job_record_imports_only_the_standard_library_and_errors() -> None:
    # The record, its transitions and its views: one pure concept in three modules.
    record = ("record", "transitions", "views")
    names = {name for module in record for name in imported(PACKAGE / "job" / f"{module}.py")}
    top_level = {name.split(".")[0] for name in names}
    # (`imported` names each name imported from a module too: vaecast.errors.X.)
    own = {
        ".".join(name.split(".")[: 3 if name.startswith("vaecast.job.") else 2])
        for name in names
        if name.startswith("vaecast")
    }
    pure = {"vaecast.errors", "vaecast.playback_deadlines"}
    assert own <= {*pure, *(f"vaecast.job.{module}" for module in record)}
    assert top_level - {"vaecast"} <= set(sys.stdlib_module_names)
    assert "vaecast.errors" in own  # the scan sees its imports


def test_the_models_base_imports_no_implementation() -> None:
    """The registry's one import cycle stays gone: the contract knows no decoder."""
    own = {name for name in imported(PACKAGE / "models" / "base.py") if name.startswith("vaecast")}
    assert not {name for name in own if name.startswith("vaecast.models")}


def test_the_readme_is_a_users_document() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    clock_times = re.findall(r"\b\d{1,2}:\d{2}(?::\d{2})?\s*(?:UTC|Z)\b|T\d{2}:\d{2}", text)
    assert not clock_times
    assert "UTC" not in text
    assert "../shared" not in text
