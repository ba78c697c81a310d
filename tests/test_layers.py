"""The layers hold: no import circle, nothing below the CLI imports it, thin subcommands, light commands."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import trainmem

PACKAGE = Path(trainmem.__file__).parent
SAMPLE = Path(__file__).parent / "data" / "chapter-sample.jsonl"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the trainmem modules it imports, at the top or inside a function (lazy imports count:
    a circle closed lazily is still a circle). `from . import x` names module x, not the package."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    assert {"trainmem.measure.stages", "trainmem.measure.engines", "trainmem.measure.runner", "trainmem.cli.sweep"} <= set(graph)
    assert cycles(graph) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check checks


def test_nothing_below_the_cli_imports_it():
    upward = {m: sorted(d for d in deps if d.startswith("trainmem.cli"))
              for m, deps in import_graph().items()
              if not m.startswith("trainmem.cli") and m != "trainmem.__main__"}
    assert {m: d for m, d in upward.items() if d} == {}


def test_the_core_imports_no_engine_above_it():
    core = import_graph()["trainmem.measure.stages"]
    assert not core & {"trainmem.measure.runner", "trainmem.measure.engines", "trainmem.measure.gloo", "trainmem.measure.fake_rank",
                       "trainmem.integrations.trainer", "trainmem.search.sweep", "trainmem.search.maxbatch"}


def test_every_subcommand_module_is_under_80_lines():
    from trainmem.cli import COMMANDS

    lengths = {name: len(Path(sys.modules[m.__name__].__file__).read_text().splitlines())
               for name, m in COMMANDS.items()}
    assert all(n < 80 for n in lengths.values()), lengths


def test_help_and_report_start_without_torch(tmp_path):
    code = ("import sys\nfrom trainmem.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            f"assert main(['report', {str(SAMPLE)!r}, '--out', {str(tmp_path)!r}]) == 0\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert (tmp_path / "report.md").is_file()
