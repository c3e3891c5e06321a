"""The shape of ``harness/`` (issues 11 and 20): no module over 500 lines, no function over 60 lines,
no import cycle between harness modules and no import from a higher layer (docs/architecture.md,
"Layers"; module-level, function-level and ``importlib.import_module("harness....")`` imports count,
``if TYPE_CHECKING:`` imports do not, they never run), and no built-in component name as a string in
the core — the built-ins declare themselves in ``variants/`` like any plugin."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.registry import Registry

from .conftest import ROOT

CORE = ROOT / "harness"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def modules(core: Path = CORE) -> dict[str, Path]:
    """module name -> file, for every module of the package at ``core``."""
    out = {}
    for p in sorted(core.rglob("*.py")):
        name = ".".join(p.relative_to(core.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def _import_module_target(node: ast.AST, mods) -> str | None:
    """The module an ``importlib.import_module("harness.x")`` (or ``import_module(f"harness.x.{name}")``)
    call imports: the named module, or for an f-string the package its constant prefix names."""
    if not (isinstance(node, ast.Call) and node.args and ast.unparse(node.func).split(".")[-1] == "import_module"):
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        name = arg.value
    elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        name = str(arg.values[0].value).rstrip(".")
    else:
        return None
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(core: Path = CORE) -> dict[str, set[str]]:
    """module -> the harness modules it imports (at module or function level, or by importlib)."""
    mods = modules(core)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                targets = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in mods] or [mod]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif _import_module_target(node, mods):
                targets = [_import_module_target(node, mods)]
            else:
                continue
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_over_500_lines():
    sizes = {name: len(p.read_text().splitlines()) for name, p in modules().items()}
    assert {n: s for n, s in sizes.items() if s > MAX_MODULE_LINES} == {}


def test_no_function_over_60_lines():
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {n} lines")
    assert long == []


def imported_from(name: str, roots=(CORE, ROOT / "tests")) -> dict[str, set[str]]:
    """file (relative to the repository) -> the modules it imports ``name`` from (``from M import name``)."""
    out: dict[str, set[str]] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(ROOT)
            package = ".".join(rel.parent.parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
                    base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                    mod = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                    out.setdefault(str(rel), set()).add(mod)
    return out


def test_run_meta_has_one_address():
    """``RunMeta`` is imported from ``harness.runmeta``, never through ``harness.store`` (which uses it)."""
    sources = imported_from("RunMeta")
    assert len(sources) > 20  # the finder sees the importers
    assert {f: m for f, m in sources.items() if m != {"harness.runmeta"} and f != "harness/store.py"} == {}


def test_no_import_cycle_between_harness_modules():
    graph = import_graph()
    assert graph["harness.suite.run"] >= {"harness.launch"}  # the graph sees function-level imports too
    assert cycles(graph) == []


#: The layers of docs/architecture.md, top to bottom: a module imports only from its own layer or
#: below. An entry names a module or a package (and everything in it); ``harness`` alone is the
#: package's ``__init__`` (the public names, imported on first use). Where the design was silent the
#: code decided: ``trial`` (the stored trial records, keys, checksums) sits with ``store``, which reads
#: and writes them; ``tasks`` is a leaf under the plugin contract, whose ``harness_add_tasks`` hook
#: returns ``Task`` s that the registry checks: the registry imports ``tasks.base``, never the reverse.
LAYERS: list[tuple[str, ...]] = [
    ("harness", "harness.__main__", "harness.cli", "harness.commands"),
    ("harness.api",),
    ("harness.experiments", "harness.suite", "harness.launch", "harness.planning", "harness.checking"),
    ("harness.request", "harness.runner", "harness.executors", "harness.resume", "harness.beside"),
    ("harness.train", "harness.trialgate", "harness.group", "harness.vectorisable", "harness.vstep", "harness.measure", "harness.perf",
     "harness.progress", "harness.saved",
     "harness.tboard", "harness.track", "harness.recipe",
     "harness.checkpoint", "harness.vcheckpoint"),
    ("harness.report", "harness.stats", "harness.overview"),
    ("harness.checks", "harness.testing"),
    ("harness.store", "harness.runmeta", "harness.trial", "harness.lookup", "harness.verification",
     "harness.provenance"),
    ("harness.model", "harness.decoder_only", "harness.init_schemes"),
    ("harness.registry", "harness.slots", "harness.plugins", "harness.hookspecs"),
    ("harness.tasks",),
    ("harness.config", "harness.settings", "harness.schedule", "harness.errors", "harness.env", "harness.metrics",
     "harness.workers"),
]

#: Upward imports allowed, (importer, imported) by name prefix, each with its reason. Keep it short.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    # Ray workers need the package's files: the package object is shipped (py_modules), no name is used
    ("harness.executors", "harness"): "ships the harness package to Ray workers",
}


def layer_of(module: str, layers=LAYERS) -> int:
    """Index of ``module``'s layer in ``layers`` (0 = top); the longest matching entry wins."""
    best = None
    for i, entries in enumerate(layers):
        for e in entries:
            if module == e or (e != "harness" and module.startswith(e + ".")):
                if best is None or len(e) > best[1]:
                    best = (i, len(e))
    if best is None:
        raise KeyError(f"{module} is in no layer: add it to LAYERS and to docs/architecture.md")
    return best[0]


def _allowed(importer: str, imported: str, allowed) -> bool:
    def under(m, prefix):
        return m == prefix or (prefix != "harness" and m.startswith(prefix + "."))
    return any(under(importer, a) and under(imported, b) for a, b in allowed)


def upward_imports(graph: dict[str, set[str]], layers=LAYERS, allowed=ALLOWED_UPWARD) -> list[str]:
    """``"importer -> imported"`` for every import of a higher layer that ``allowed`` does not excuse."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if layer_of(t, layers) < layer_of(m, layers) and not _allowed(m, t, allowed))


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "harness" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "harness"


def test_the_layer_check_flags_planted_upward_imports(tmp_path):
    core = _plant(tmp_path, {
        "__init__.py": "", "commands/__init__.py": "", "commands/x.py": "from ..config import A\n",
        "cli.py": "import importlib\ndef load(n):\n    return importlib.import_module(f'harness.commands.{n}')\n",
        "config.py": "def late():\n    import importlib\n    return importlib.import_module('harness.commands.x')\n",
        "store.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .train import T\nfrom .config import A\n",
        "model.py": "def build():\n    from .train import run_trial\n",
        "train.py": "from harness.store import S\nfrom . import config\n",
        "tasks/__init__.py": "", "tasks/base.py": "from ..model import M\n",
    })
    graph = import_graph(core)
    assert graph["harness.cli"] == {"harness.commands"}  # an f-string import names its package
    assert upward_imports(graph, allowed={}) == ["harness.config -> harness.commands.x",  # importlib, in a function
                                                 "harness.model -> harness.train",  # function level
                                                 "harness.tasks.base -> harness.model"]  # the module's own layer
    assert upward_imports(graph, allowed={("harness.config", "harness.commands"): "why"}) == \
        ["harness.model -> harness.train", "harness.tasks.base -> harness.model"]
    with pytest.raises(KeyError, match="no layer"):
        layer_of("harness.newthing")


def test_no_module_imports_from_a_higher_layer():
    graph = import_graph()
    assert {layer_of(m) for m in graph}  # every module has a layer (KeyError names the one that has none)
    assert upward_imports(graph) == []


def test_the_allowed_upward_imports_are_still_there():
    """An allow-list entry whose import is gone must go too."""
    graph = import_graph()
    stale = [pair for pair in ALLOWED_UPWARD if not any(_allowed(m, t, {pair: ""}) for m in graph for t in graph[m])]
    assert stale == []


def _builtin_component_names() -> set[str]:
    reg = Registry.from_plugins()
    return {name for (slot, name) in reg.components}


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """String literals that are not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


#: Strings equal to a built-in component name that mean something else there: a Python type name in
#: the config validator, the torch version key of the environment block, the norm slot's class attribute
#: ``parallel`` (any component may declare it; the built-in ``norm=parallel`` is one of them).
NOT_A_COMPONENT = {("harness/config.py", "bool"), ("harness/env.py", "torch"), ("harness/model.py", "parallel"),
                   ("harness/checks/contract_layers.py", "parallel")}


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_builtin_component_name_in_the_core(path):
    names, rel = _builtin_component_names(), str(path.relative_to(ROOT))
    found = [f"{rel}:{line}: {value!r}" for line, value in _string_constants(path)
             if value in names and (rel, value) not in NOT_A_COMPONENT]
    assert found == []


def test_the_name_scan_sees_a_planted_builtin_name(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text('"""docstring naming bool is fine"""\nDEFAULT_MASK = "bool"\n')
    assert _string_constants(planted) == [(2, "bool")]


def test_a_run_reads_each_trial_file_once(tmp_path, monkeypatch):
    """One ``run`` (store, tables, report, terminal table) parses every trial file exactly once."""
    import collections

    import harness
    from harness import store as store_mod

    counts = collections.Counter()
    real = store_mod.read_trial_file

    def counting(path):
        counts[Path(path).name] += 1
        return real(path)

    monkeypatch.setattr(store_mod, "read_trial_file", counting)
    folder = harness.run(variants=["baseline", "pre_norm"], seeds=2, preset="tiny", results_dir=tmp_path,
                         run_id="r", jobs=1)
    files = sorted(p.name for p in (folder / "trials").glob("*.json"))
    assert len(files) == 4 and (folder / "report.md").is_file()
    assert dict(counts) == {name: 1 for name in files}


def test_a_run_from_the_command_line_aggregates_once(tmp_path, monkeypatch, capsys):
    """report.md's table and the table printed on the terminal are one aggregation, not two."""
    from harness import cli
    from harness.report import tables, writer

    calls = []
    real = tables.aggregate

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tables, "aggregate", counting)
    monkeypatch.setattr(writer, "aggregate", counting)
    code = cli.main(["run", "--variants", "baseline", "pre_norm", "--preset", "tiny", "--seeds", "2", "--jobs", "1",
                     "-q", "--results-dir", str(tmp_path), "--run-id", "r"])
    out = capsys.readouterr().out
    assert code == 0 and "| pre_norm " in out  # the terminal table was printed ...
    assert len(calls) == 1  # ... from the report's one aggregation
    results = (tmp_path / "r" / "report.md").read_text().split("## Results", 1)[1].split("\n## ", 1)[0]
    table = [line for line in results.splitlines() if line.startswith("| pre_norm ")]
    shown = next(line for line in out.splitlines() if line.startswith("| pre_norm "))
    cells = [c.strip().rstrip("…") for c in shown.strip("|").split("|")]
    assert table and len(cells) >= 4 and all(c in table[-1] for c in cells)  # the results row's cells, narrowed


def test_the_training_loop_is_used_through_its_public_members():
    """The trial group (and anything else outside train.py) drives :class:`harness.train.TrainingLoop` through its
    public methods: no module reads a ``_``-prefixed member of the loop (its private names are train.py's own)."""
    train_src = (CORE / "train.py").read_text()
    loop = next(n for n in ast.walk(ast.parse(train_src)) if isinstance(n, ast.ClassDef) and n.name == "TrainingLoop")
    private = {n.name for n in loop.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_")
               and not n.name.startswith("__")}
    private |= {n.attr for n in ast.walk(loop) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
                and isinstance(n.value, ast.Name) and n.value.id == "self"}
    assert "_steps" in private  # the finder sees the loop's own private names
    readers = []
    for name, path in modules().items():
        if name == "harness.train":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id == "self"):
                readers.append(f"{name}:{node.lineno} .{node.attr}")
    assert readers == [] and "class _Loop" not in train_src
