"""The architecture as a test: data flows one way through the layers, and only collection imports torch."""
import ast
import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "dagprof"
# Each layer may import only layers before it. pipeline, demo and cli sit on top and may use all.
ORDER = ["errors", "fsutil", "progress", "traces", "costmodel", "collect", "align", "graph", "passes", "replay", "analysis", "search", "sgd", "report"]


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


def test_core_never_imports_torch():
    core = [f"dagprof.{p.relative_to(SRC.parent).with_suffix('').as_posix().split('/', 1)[1].replace('/', '.')}"
            for p in SRC.rglob("*.py") if "collect" not in p.parts and p.name != "__main__.py"]
    modules = sorted(m.removesuffix(".__init__") for m in core)
    code = f"import importlib, sys\nfor m in {modules!r}:\n    importlib.import_module(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
