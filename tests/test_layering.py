"""The architecture as a test: data flows one way through the layers, and only collection imports a framework (torch, TensorFlow, JAX)."""
import ast
import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "dagprof"
# Each layer may import only layers before it; the layers of one tier (a tuple) are peers and import none of each other.
# On top, ranked too: pipeline (open_run) < closeloop (search and verify) < demo < cli.
ORDER = ["errors", "units", "fsutil", "progress", "traces", "costmodel", "collect", "align", "graph", "passes", "replay", "analysis",
         ("search", "sgd"), "report", "pipeline", "closeloop", "demo", "cli"]
RANK = {layer: i for i, tier in enumerate(ORDER) for layer in (tier if isinstance(tier, tuple) else (tier,))}
# Layers that may import only the named ones, whatever sits below them: the report draws what the analysis and
# the searches computed, from the traces and graph they came from; it prices, transforms and collects nothing.
ALLOWED = {"report": {"errors", "units", "fsutil", "progress", "traces", "align", "graph", "replay", "analysis", "search"}}
# Inside a layer with rooms, the rooms are ranked the same way: collection's profilers and measurements are peers,
# deploying a strategy uses the hooks, and the jobs (launch, cluster, demo) use all three.
ROOMS = {"collect": [("hooks", "measure"), "deploy", "jobs"]}


def imports_of(path: pathlib.Path) -> set[str]:
    """Top-level dagprof packages a file imports (relative imports resolved)."""
    pkg = path.relative_to(SRC).parts
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(pkg[: len(pkg) - node.level])
            target = base + (node.module.split(".") if node.module else [])
            if target:
                out.add(target[0].removesuffix(".py"))
            elif node.names:  # "from .. import x"
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dagprof."):
            out.add(node.module.split(".")[1])
    return out


def test_layers_only_import_earlier_layers():
    bad = []
    for layer in RANK:
        files = [SRC / f"{layer}.py"] if (SRC / f"{layer}.py").exists() else sorted((SRC / layer).rglob("*.py"))
        for f in files:
            for dep in imports_of(f):
                if dep in RANK and dep != layer and RANK[dep] >= RANK[layer]:
                    bad.append(f"{f.relative_to(SRC)} imports {dep}" + (" (a peer)" if RANK[dep] == RANK[layer] else ""))
    assert not bad, bad


def test_restricted_layers_import_only_what_they_name():
    bad = [f"{f.relative_to(SRC)} imports {dep}" for layer, allowed in ALLOWED.items() for f in sorted((SRC / layer).rglob("*.py"))
           for dep in imports_of(f) if dep in RANK and dep != layer and dep not in allowed]
    assert not bad, bad


def test_rooms_only_import_earlier_rooms():
    bad = []
    imports = _module_imports()
    for layer, order in ROOMS.items():
        rank = {room: i for i, tier in enumerate(order) for room in (tier if isinstance(tier, tuple) else (tier,))}
        for m, deps in imports.items():
            parts = m.split(".")
            if len(parts) < 3 or parts[1] != layer:  # another layer, or the layer's own facade (its __init__)
                continue
            if parts[2] not in rank:
                bad.append(f"{m} is in no room of {layer}/")
                continue
            for d in deps:
                dp = d.split(".")
                if dp[1:2] != [layer] or dp[2:3] == [parts[2]]:
                    continue
                if len(dp) == 2 or dp[2] not in rank or rank[dp[2]] >= rank[parts[2]]:
                    bad.append(f"{m} imports {d}" + (" (a peer)" if len(dp) > 2 and rank.get(dp[2]) == rank[parts[2]] else ""))
    assert not bad, bad


def _module_imports() -> dict[str, set[str]]:
    """dagprof module -> the dagprof modules it imports anywhere (lazily and under TYPE_CHECKING too)."""
    mods = {".".join(p.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__"): p for p in SRC.rglob("*.py")}
    out = {}
    for m, p in mods.items():
        pkg = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("dagprof")):
                continue
            base = pkg[: len(pkg) - node.level + 1] + (node.module.split(".") if node.module else []) if node.level else node.module.split(".")
            target = ".".join(base)
            named = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]  # "from . import kernels"
            deps.update(named or ([target] if target in mods else []))
        out[m] = deps - {m}
    return out


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

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
            comp = set()
            while (w := stack.pop()) != v:
                comp.add(w)
            if comp:
                found.append(frozenset(comp | {v}))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    """Not even type-only or lazy: a type two modules share lives below both, a call back up is handed in."""
    cycles = [sorted(c) for c in _cycles(_module_imports())]
    assert not cycles, f"modules that import each other (directly or round a circle): {cycles}"


FRAMEWORKS = ("torch", "tensorflow", "jax", "keras", "tf_keras")


def _modules(include_collect: bool) -> list[str]:
    return sorted(f"dagprof.{p.relative_to(SRC).with_suffix('').as_posix().replace('/', '.')}".removesuffix(".__init__")
                  for p in SRC.rglob("*.py") if (include_collect or "collect" not in p.parts) and p.name != "__main__.py")


def _imported_frameworks(modules: list[str]) -> list[str]:
    code = (f"import importlib, sys\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
            f"print(','.join(f for f in {FRAMEWORKS!r} if f in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [f for f in out.stdout.strip().split(",") if f]


def test_core_never_imports_a_framework():
    assert _imported_frameworks(_modules(include_collect=False)) == []


def test_collection_imports_frameworks_only_when_profiling_starts():
    assert _imported_frameworks(_modules(include_collect=True)) == []


def test_only_collection_names_a_framework_in_its_imports():
    """Anywhere outside collect/, the commands on top included: they call collect/, which imports lazily."""
    bad = set()
    for f in SRC.rglob("*.py"):
        if f.relative_to(SRC).parts[0] == "collect":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            if any(n.split(".")[0] in FRAMEWORKS for n in names):
                bad.add(f.relative_to(SRC).as_posix())
    assert sorted(bad) == [], "import a framework outside collect/"
