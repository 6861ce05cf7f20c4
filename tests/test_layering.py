"""The architecture as a test: data flows one way through the layers, and only collection imports a framework (torch, TensorFlow, JAX)."""
import ast
import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "dagprof"
# Each layer may import only layers before it. pipeline, demo and cli sit on top and may use all.
ORDER = ["errors", "units", "fsutil", "progress", "traces", "costmodel", "collect", "align", "graph", "passes", "replay", "analysis", "search", "sgd", "report"]


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
    for layer in ORDER:
        files = [SRC / f"{layer}.py"] if (SRC / f"{layer}.py").exists() else sorted((SRC / layer).rglob("*.py"))
        for f in files:
            for dep in imports_of(f):
                if dep in ORDER and dep != layer and ORDER.index(dep) > ORDER.index(layer):
                    bad.append(f"{f.relative_to(SRC)} imports {dep}")
    assert not bad, bad


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
    """In the layers (commands on top may import collection's frameworks lazily, as calibrate does)."""
    bad = []
    for f in SRC.rglob("*.py"):
        layer = f.relative_to(SRC).parts[0].removesuffix(".py")
        if layer not in ORDER or layer == "collect":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            bad += [f"{f.relative_to(SRC)} imports {n}" for n in names if n.split(".")[0] in FRAMEWORKS]
    assert not bad, bad
