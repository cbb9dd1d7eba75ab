"""The house reads one way: every orkpack module sits in a layer, and imports only its own layer or those below,
with no circle of imports anywhere. Every ``import`` counts, module-level or inside a function (a lazy import up is
still an arrow up). README.md "Layout of the code" describes the same layers."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "orkpack"

# bottom to top; a module belongs to the first layer one of whose prefixes is the module or a package holding it
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("orkpack", "orkpack.errors", "orkpack.layout", "orkpack.globs", "orkpack.files", "orkpack.gcpause")),
    ("format", ("orkpack.archs", "orkpack.ggufkeys", "orkpack.pack")),
    ("sources", ("orkpack.sources", "orkpack.keepfloat")),
    ("model", ("orkpack.model", "orkpack.synth")),
    ("codecs", ("orkpack.codecs", "orkpack._kernels")),
    ("stats", ("orkpack.stats",)),
    ("transforms", ("orkpack.transforms",)),
    ("planner", ("orkpack.tiers",)),
    ("build", ("orkpack.build",)),
    ("runtime", ("orkpack.runtime",)),
    ("eval", ("orkpack.eval",)),
    ("presentation", ("orkpack.inspect", "orkpack.render")),
    ("cli", ("orkpack.cli", "orkpack.__main__")),
)


def layer_of(module: str) -> int | None:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    # "orkpack" itself is only the package's __init__, not everything below it
    if best is not None and best[1] == len("orkpack") and module != "orkpack":
        return None
    return None if best is None else best[0]


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(orkpack module imported, line) for every import in the file, at any depth."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "orkpack"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "orkpack":
                continue
            for a in node.names:  # `from pkg import sub` imports the submodule
                out.append((f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod, node.lineno))
    return [(m, ln) for m, ln in out if m != module]


def graph(root: Path) -> tuple[dict[str, Path], dict[str, list[tuple[str, int]]]]:
    mods = modules(root)
    known = set(mods) | {"orkpack._kernels"}
    return mods, {m: imports(m, p, known) for m, p in mods.items()}


def upward(root: Path) -> list[str]:
    """Every import of a module from a layer above its own, and every module no layer holds."""
    mods, g = graph(root)
    bad = []
    for m, deps in g.items():
        lm = layer_of(m)
        if lm is None:
            bad.append(f"{m}: in no layer (add it to LAYERS and to README's layout)")
            continue
        for d, line in deps:
            ld = layer_of(d)
            if ld is not None and ld > lm:
                bad.append(f"{mods[m].relative_to(root.parent)}:{line}: {m} ({LAYERS[lm][0]}) imports {d} "
                           f"({LAYERS[ld][0]}), a layer above it")
    return bad


def cycles(root: Path) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    _, g = graph(root)
    adj = {m: sorted({d for d, _ in deps if d in g}) for m, deps in g.items()}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
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

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return out


def test_no_import_goes_up_a_layer():
    assert upward(ROOT) == []


def test_no_circle_of_imports():
    assert cycles(ROOT) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "orkpack"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


BASE_TREE = {"__init__.py": "", "errors.py": "", "codecs/__init__.py": "from ..errors import x\n",
             "codecs/reference.py": "def f():\n    from orkpack.layout import y\n", "layout.py": "",
             "build/__init__.py": "from .pipeline import build\n", "build/pipeline.py": "from ..codecs import z\n"}


def test_the_checker_sees_an_upward_import_even_a_lazy_one(tmp_path):
    assert upward(_tree(tmp_path / "a", BASE_TREE)) == [] and cycles(_tree(tmp_path / "b", BASE_TREE)) == []
    bad = BASE_TREE | {"codecs/reference.py": "def f():\n    from orkpack.build.pipeline import build\n"}
    found = upward(_tree(tmp_path / "c", bad))
    assert len(found) == 1 and "orkpack.codecs.reference (codecs) imports orkpack.build.pipeline (build)" in found[0]


@pytest.mark.parametrize("files,want", [
    ({"codecs/a.py": "from . import b\n", "codecs/b.py": "def f():\n    from .a import g\n"},
     [["orkpack.codecs.a", "orkpack.codecs.b"]]),
    ({"codecs/a.py": "from orkpack.codecs import b\n", "codecs/b.py": "import orkpack.codecs.a\n"},
     [["orkpack.codecs.a", "orkpack.codecs.b"]]),
])
def test_the_checker_sees_a_circle_inside_a_layer(tmp_path, files, want):
    assert cycles(_tree(tmp_path, BASE_TREE | files)) == want


def test_every_module_has_a_layer(tmp_path):
    assert upward(_tree(tmp_path, BASE_TREE | {"newroom.py": ""})) == ["orkpack.newroom: in no layer (add it to "
                                                                        "LAYERS and to README's layout)"]


def test_every_package_is_installed():
    """pyproject.toml lists its packages by hand: every folder of modules must be a package and be listed, or a
    non-editable install leaves it out."""
    import tomllib

    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT.parent).parts) for p in ROOT.rglob("*.py")}
    assert {f for f in folders if not (ROOT.parent / f.replace(".", "/") / "__init__.py").is_file()} == set()
    assert folders - listed == set() and listed - folders == set()
