"""Packaging and the dependency direction: passes/, lowering/, kernels/ import as ssmcc.* and never
under bare names; the project's modules form no import cycle; each layer imports only the layers
below it (ops -> frontend / passes -> lowering -> runtime -> api / cli); nothing imports tests."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import networkx as nx
import pytest

import ssmcc.kernels
import ssmcc.lowering
import ssmcc.passes

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {"ssmcc": "ssmcc", "passes": "ssmcc.passes", "lowering": "ssmcc.lowering"}
PACKAGE_DIRS["kernels"] = "ssmcc.kernels"


def test_subpackages_map_to_top_level_folders():
    for module, folder in (
        (ssmcc.passes, "passes"),
        (ssmcc.lowering, "lowering"),
        (ssmcc.kernels, "kernels"),
    ):
        assert pathlib.Path(module.__file__).resolve().parent == REPO / folder


def test_nothing_installed_under_bare_names(tmp_path):
    """From a neutral directory (no repository on sys.path) only ssmcc.* resolves."""
    probe = (
        "import importlib.util as u; "
        "print([b for b in ('passes', 'lowering', 'kernels') "
        f"if (s := u.find_spec(b)) and s.origin and s.origin.startswith({str(REPO)!r})])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _modules() -> dict[str, pathlib.Path]:
    """Every project module by its import name."""
    found = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _imports(path: pathlib.Path, name: str, modules) -> set[str]:
    """Project modules imported anywhere in the file (module level and inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                imported.add(candidate)
    return imported


@pytest.fixture(scope="module")
def import_graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in _imports(path, name, modules):
            # a package's __init__ importing its own submodules is not a cycle of imports
            graph.add_edge(name, target)
    return graph


def test_no_import_cycle(import_graph):
    cycles = list(nx.simple_cycles(import_graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


LAYERS = [  # a module may import modules of its own layer and of the layers before it
    ("ssmcc.version", "ssmcc.errors", "ssmcc.progress", "ssmcc.file_pages", "ssmcc.ops"),
    ("ssmcc.bounded_json", "ssmcc.artifact_files"),
    ("ssmcc.options",),
    ("ssmcc.frontend", "ssmcc.passes", "ssmcc.kernels"),
    ("ssmcc.lowering",),
    ("ssmcc.runtime",),
    ("ssmcc.api", "ssmcc.presets", "ssmcc.presets_hybrid"),
    ("ssmcc.cli", "ssmcc"),
]


def _layer(module: str) -> int:
    best, level = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    assert level is not None, f"{module} belongs to no layer of LAYERS"
    return level


def test_imports_point_down_the_layers(import_graph):
    upward = [
        f"{a} -> {b}"
        for a, b in import_graph.edges
        if _layer(b) > _layer(a) and not (a == "ssmcc" and b.startswith("ssmcc."))
    ]
    assert not upward, "imports against the dependency direction:\n" + "\n".join(upward)


def test_op_library_imports_torch_only(import_graph):
    """The op library imports itself, ``ssmcc.errors`` (a leaf: it imports nothing), the
    standard library and torch."""
    leaves = {"ssmcc.errors"}
    assert not set(import_graph.successors("ssmcc.errors"))
    for module in import_graph:
        if module.startswith("ssmcc.ops"):
            assert all(
                t.startswith("ssmcc.ops") or t in leaves for t in import_graph.successors(module)
            ), module
            tree = ast.parse(_modules()[module].read_text())
            third_party = {
                (alias.name if isinstance(node, ast.Import) else node.module).split(".")[0]
                for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
                for alias in node.names
            } - {"ssmcc", *sys.stdlib_module_names}
            assert third_party <= {"torch"}, (module, third_party)


def test_passes_know_no_backend_and_targets_not_each_other(import_graph):
    """A target imports another only when its ``Target`` says it builds on it (``builds_on``)."""
    from ssmcc.lowering.registry import targets

    builds_on = {t.name: t.builds_on for t in targets()}
    for a, b in import_graph.edges:
        if a.startswith("ssmcc.passes"):
            assert not b.startswith(("ssmcc.lowering", "ssmcc.kernels")), f"{a} -> {b}"
        if a.startswith("ssmcc.lowering.") and b.startswith("ssmcc.lowering."):
            own, other = a.split(".")[2], b.split(".")[2]
            shared = ("registry", "table", "artifact_checks")
            allowed = own == other or other in shared or own in shared
            assert allowed or other in builds_on.get(own, ()), f"{a} -> {b}"


def test_nothing_imports_tests():
    for folder in ("ssmcc", "passes", "lowering", "kernels", "benchmarks", "examples"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                assert not any(n == "tests" or n.startswith("tests.") for n in names), path


def test_op_library_alone_loads_no_onnx():
    probe = "import sys, ssmcc.ops; assert 'onnx' not in sys.modules, 'onnx imported'"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_every_package_is_installed():
    """Each folder with an __init__.py is listed in pyproject's packages (else a non-editable
    install would miss it)."""
    import tomllib

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert found == listed


def _pass_functions() -> dict[str, str]:
    """Every pass (``(program, ctx)``) and graph rewrite (``(graph_module, ctx)``) the passes
    package defines: name -> its module."""
    import importlib
    import inspect

    found = {}
    for module_name in _modules():
        if not module_name.startswith("ssmcc.passes."):
            continue
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if not inspect.isfunction(value) or value.__module__ != module_name:
                continue
            params = list(inspect.signature(value).parameters)
            if params[:2] in (["program", "ctx"], ["graph_module", "ctx"]):
                found[name] = module_name
    return found


def test_pass_order_is_decided_in_pipelines_only():
    """No module but ``passes/pipelines.py`` (the lists) and ``passes/manager.py`` (which runs
    them) names a pass: importing one elsewhere is building a pass list or calling a pass
    directly. The module that defines a pass may call it (a pass reusing its own rewrite)."""
    from ssmcc.passes import pipelines

    passes = _pass_functions()
    listed = {f.__name__ for f in pipelines.quantization() + pipelines.dynamo_rewrites()}
    listed |= {f.__name__ for name in pipelines.PIPELINES for f in pipelines.pipeline(name)}
    listed |= {state_pass.__name__ for _, state_pass in pipelines.DERIVATIONS.values()}
    assert listed <= set(passes), listed - set(passes)
    pass_modules = {m.rsplit(".", 1)[1] for m in passes.values()} | {"passes"}
    allowed = {"ssmcc.passes.pipelines", "ssmcc.passes.manager"}
    offenders = []
    for module_name, path in _modules().items():
        if module_name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.Attribute) and ast.unparse(node.value).split(".")[-1] in (
                pass_modules
            ):  # module.pass (an FX graph's own eliminate_dead_code is no pass of ours)
                names = [node.attr]
            for name in names:
                if name in passes and passes[name] != module_name:
                    offenders.append(f"{module_name}:{node.lineno} names pass {name}")
    assert not offenders, "\n".join(offenders)
