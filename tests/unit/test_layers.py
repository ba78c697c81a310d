"""The layers hold: no import circle, each layer imports only those below it, CUDA behaviour decided once, thin
subcommands, light commands."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import trainmem

PACKAGE = Path(trainmem.__file__).parent
TESTS = Path(__file__).parents[1]
SAMPLE = TESTS / "data" / "chapter-sample.jsonl"


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
    assert {"trainmem.measure.stages", "trainmem.isolation.engines", "trainmem.isolation.runner", "trainmem.cli.sweep"} <= set(graph)
    assert cycles(graph) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check checks


def unit(module: str) -> str:
    """The layer a module belongs to: its top package under trainmem (`estimator.memory` and `estimator.time`
    apart from `estimator` itself), or the top-level module."""
    parts = module.split(".")[1:] or ["trainmem"]
    if parts[0] == "estimator" and len(parts) > 1 and parts[1] in ("memory", "time"):
        return ".".join(parts[:2])
    return parts[0]



ALLOWED: dict[str, set[str] | None] = {
    "errors": set(), "version": set(), "result": set(), "fsdp": set(), "hardware": set(), "forked": set(),
    "config": {"errors", "hardware"},
    "measure": {"config", "errors", "fsdp", "hardware", "result", "version"},
    "estimator.memory": {"config", "forked", "fsdp", "hardware", "measure.accumulation", "measure.build",
                         "measure.ledger", "measure.train"},
    "estimator.time": {"config", "estimator.memory", "hardware", "measure.accumulation", "measure.build",
                       "measure.ledger"},
    "estimator": {"config", "errors", "estimator.memory", "estimator.time", "forked", "hardware", "measure.deepspeed",
                  "result", "version"},
    "integrations": {"config", "estimator", "measure", "result"},
    "isolation": {"config", "errors", "integrations", "measure", "result"},
    "search": {"config", "errors", "estimator", "estimator.memory", "forked", "hardware", "isolation", "result"},
    "output": {"config", "hardware", "result", "search"},
    "experiment": {"config", "isolation", "result"},
    "serve": None,  # on top, beside the CLI: the web page's own door to everything
    "cli": None,  # on top: anything
    "__main__": {"cli"},
    "trainmem": {"config", "errors", "estimator", "experiment", "hardware", "isolation", "measure", "result", "search",
                 "version"},
}
"""What each layer imports, bottom to top (docs/architecture.md), and no more: a layer that starts to need another
below it says so here; None: anything. Lazy imports count. The estimator's layers use of `measure` only what they
share with real runs (the ledger, the builder of model and optimizer, the loss rule, the loop's probe steps, the
DeepSpeed config a ZeRO rank runs with), never an engine (stages, ranks, emulation, the isolation above them)."""


def allowed(importer: str, imported: str) -> bool:
    """Whether `importer` may import `imported` under ALLOWED (a layer names `measure.x` to allow one module)."""
    a, b = unit(importer), unit(imported)
    rule = ALLOWED[a]
    if a == b or rule is None or b in rule:
        return True
    return b == "measure" and ".".join(imported.split(".")[1:3]) in rule


def test_each_layer_imports_only_the_layers_below_it():
    graph = import_graph()
    assert {unit(m) for m in graph} <= set(ALLOWED), "a new package: give it a row in ALLOWED"
    upward = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if not allowed(m, d))
    assert upward == []
    assert not allowed("trainmem.estimator.memory.simulate", "trainmem.measure.stages")  # the check checks
    assert allowed("trainmem.estimator.memory.simulate", "trainmem.measure.build")
    assert not allowed("trainmem.config.setup", "trainmem.measure.build")
    assert not allowed("trainmem.search.plan", "trainmem.cli.run")
    used: dict[str, set[str]] = {}
    for m, deps in graph.items():
        for d in deps:
            if unit(d) != unit(m):
                used.setdefault(unit(m), set()).add(".".join(d.split(".")[1:3]) if unit(d) == "measure" else unit(d))
    slack = {layer: sorted(r for r in rule if not any(u == r or u.startswith(r + ".") for u in used.get(layer, ())))
             for layer, rule in ALLOWED.items() if rule is not None}
    assert {layer: s for layer, s in slack.items() if s} == {}, "an allowed import nothing uses: drop it from ALLOWED"


def test_the_package_keeps_few_top_level_modules():
    modules = [p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"]
    assert len(modules) <= 8, modules


def test_every_cuda_behaviour_is_defined_once():
    """What CUDA does (the SDPA kernel, cuBLAS workspaces, memory outside the allocator) is decided in
    hardware/cuda.py alone: no other module defines a name it exports, spells PyTorch's workspace configs or
    picks SDPA backends."""
    from trainmem.hardware import cuda

    owner = PACKAGE / "hardware" / "cuda.py"
    names = set(cuda.__all__)
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path == owner:
            continue
        text = path.read_text()
        for node in ast.parse(text).body:  # module-level definitions (a method may delegate to cuda)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined = node.name
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                defined = node.targets[0].id
            else:
                continue
            if defined in names:
                found.append(f"{path.name}: defines {defined}")
        for spelled in (":4096:8", ":4096:2:16:8", "SDPBackend"):
            if spelled in text:
                found.append(f"{path.name}: spells {spelled}")
    assert found == []


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


def test_a_mistyped_value_is_answered_before_torch_or_the_model():
    """A setup's own problems (a value not among the choices, a bad number) are answered before the model is
    resolved and before torch is imported: a fraction of a second, with the nearest choice."""
    code = ("import sys\nfrom trainmem.cli import main\n"
            "assert main(['estimate', '--model', 'llama-3.1-8b', '--optimizer', 'adamw8bit', '--seq-len', '0']) == 2\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch was imported'\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "--optimizer: 'adamw8bit' is not one of" in p.stderr and "did you mean adamw-8bit?" in p.stderr
    assert "--seq-len: must be a whole number >= 1" in p.stderr


def reaches_into_benchmarks(source: str, scripts: set[str]) -> list[str]:
    """The statements of a test's source that put benchmarks/ on sys.path or import one of its `scripts` by name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and ast.unparse(node.func.value) == "sys.path" and "benchmarks" in ast.unparse(node)):
            found.append(ast.unparse(node))
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found += [f"import {n}" for n in names if n.split(".")[0] in scripts]
    return found


def test_no_test_reaches_into_benchmarks():
    """Tests import the lab code they check from `lab/` (the checkout's root is on pytest's path): benchmarks/
    holds command lines over it, and no test puts that folder on sys.path or imports a script of it."""
    scripts = {p.stem for p in (TESTS.parent / "benchmarks").glob("*.py")}
    assert {"time_validate", "docs_tables"} <= scripts
    found = [f"{path.relative_to(TESTS)}: {s}" for path in sorted(TESTS.rglob("*.py"))
             for s in reaches_into_benchmarks(path.read_text(), scripts)]
    assert found == []
    old = ('import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))\n'
           'import time_validate\n')
    assert len(reaches_into_benchmarks(old, scripts)) == 2  # the check checks


def test_every_test_sits_in_a_tier():
    """tests/unit (derived values, CPU, minutes in all), tests/slow (real-sized estimates and sweeps), tests/regression
    (snapshots of the docs and committed tables, for the pinned versions), tests/gpu (a CUDA device): each tier's
    README.md says what belongs there; fixtures stay in tests/conftest.py, above all four."""
    tiers = {"unit", "slow", "regression", "gpu"}
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []
    assert {p.parent.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py")} == tiers
    assert all((TESTS / tier / "README.md").is_file() for tier in tiers) and (TESTS / "conftest.py").is_file()


def test_the_package_holds_no_lab():
    """The wheel ships src/trainmem alone: no module of it imports the lab (validation tooling, the manifest of
    measured sets), and its code names no numbered held-out set or change: that history is docs/lab's."""
    import re

    lab_imports = [f"{name}: {node.module or node.names[0].name}" for name, path in _modules().items()
                   for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0)
                   and ((node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name)
                   .split(".")[0] in ("lab", "benchmarks")]
    assert lab_imports == []
    history = re.compile(r"held-out [0-9]+|change [0-9]+", re.I)
    named = [f"{p.relative_to(PACKAGE)}:{i}" for p in sorted(PACKAGE.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if history.search(line)]
    assert named == []
    assert history.search("as held-out 12 showed") and not (PACKAGE / "validation").exists()
