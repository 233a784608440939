"""The GPU backend's layers (ARCHITECTURE.md): every import inside ``vtnumba/cuda`` runs downward, and
no group of modules imports itself in a circle.

    ptx/       0  numba-cuda's target, bit and PTX primitives
    runtime/   1  the launcher, the per-device records, cuBLASLt's binding
    kernels/   2  the @cuda.jit kernels and how each is launched
    *.py       3  dispatch: which kernels run a call (gemm, block, quantize, bound, graphs, capabilities)
    __init__   4  the backend ``vtnumba.ops`` calls

A module may import its own layer and the layers below it; it may not import a layer above, nor
take part in a circle of imports (lazy imports inside functions count: a circle that only closes at
run time is still a circle a reader must untangle). Outside ``vtnumba.cuda`` it may import only
vtnumba's private helpers (``_arrays``, ``_format``, ``_config``), never ``ops``, the seam or
torch. The imports are read from the source with ``ast``, so nothing here needs a GPU or numba-cuda.
"""

import ast
import importlib
import pathlib
import re

import pytest

import vtnumba

CUDA = pathlib.Path(vtnumba.__file__).parent / "cuda"
LAYERS = {"ptx": 0, "runtime": 1, "kernels": 2}
DISPATCH, BACKEND = 3, 4
# the helpers below vtnumba.cuda that it may import: dtypes, formats, settings, and the tests' fault hook
SHARED_OUTSIDE = {"vtnumba._arrays", "vtnumba._format", "vtnumba._config", "vtnumba._faults"}
# the modules' names before vtnumba.cuda was split into layers, each beside where it lives now: the
# old names are gone, so nothing may import them
OLD_NAMES = {
    "target": "ptx.target",
    "codec": "ptx.codec",
    "mma": "ptx.mma",
    "wgmma": "ptx.sm90_wgmma",
    "launch": "runtime.launch",
    "device": "runtime.device",
    "cublaslt": "runtime.cublaslt",
    "quant": "kernels.quant",
    "epilogue": "kernels.epilogue",
    "tiled": "kernels.tiled",
    "gemv": "kernels.gemv",
    "tc_gemm": "kernels.tc_gemm",
    "tc_gemv": "kernels.tc_gemv",
    "wg_gemm": "kernels.sm90_wgmma_gemm",
}


def _module_name(path):
    parts = path.relative_to(CUDA.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(p): p for p in sorted(CUDA.rglob("*.py"))}


def layer(name):
    """The layer of a module of vtnumba.cuda (a sub-package's __init__ is in its package's layer)."""
    if name == "vtnumba.cuda":
        return BACKEND
    sub = name.split(".")[2]
    return LAYERS.get(sub, DISPATCH)


def imports(name, path, modules):
    """The absolute names of the vtnumba modules ``name`` imports (anywhere in the file). ``from P
    import x`` counts as importing P.x when that is a module, else P."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("vtnumba"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("vtnumba"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(
                    sub
                    if sub in modules or (CUDA.parent / "/".join(sub.split(".")[1:])).with_suffix(".py").exists()
                    else target
                )
    return found


def _graph():
    modules = _modules()
    return modules, {name: imports(name, path, modules) for name, path in modules.items()}


def test_the_layers_are_all_there():
    modules, graph = _graph()
    layers = {layer(name) for name in modules}
    assert layers == {0, 1, 2, DISPATCH, BACKEND}, layers
    edges = sum(len(targets) for targets in graph.values())
    assert edges > 60, edges  # non-vacuous: the kernels alone import the primitives dozens of times
    assert imports("vtnumba.cuda.gemm", modules["vtnumba.cuda.gemm"], modules) >= {
        "vtnumba.cuda.kernels.tc_gemm",
        "vtnumba.cuda.runtime.cublaslt",
        "vtnumba.cuda.quantize",
    }


def test_imports_run_downward():
    modules, graph = _graph()
    upward = sorted(
        (name, target, layer(name), layer(target))
        for name, targets in graph.items()
        for target in targets
        if target.startswith("vtnumba.cuda") and layer(target) > layer(name)
    )
    assert not upward, "imports from a layer above (module, import, its layer, the import's layer):\n" + "\n".join(
        map(str, upward)
    )


def test_no_module_outside_the_backend_but_the_shared_helpers():
    modules, graph = _graph()
    outside = sorted(
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if not target.startswith("vtnumba.cuda") and target not in SHARED_OUTSIDE | {"vtnumba"}
    )
    assert not outside, outside
    # "from ... import _format" names the package vtnumba with a module of it: resolved above, so a
    # bare "vtnumba" would be an import of the package itself (ops, seam): none
    assert not [name for name, targets in graph.items() if "vtnumba" in targets]


def _cycles(graph):
    """The strongly connected components of more than one module (or a module importing itself)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_circle_of_imports():
    _, graph = _graph()
    # the checker finds a circle when there is one
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles(graph) == []


def test_the_repository_imports_the_new_paths():
    """tests, benchmarks, examples, tools and vtnumba itself name the modules where they now live."""
    root = CUDA.parent.parent
    old = [f"vtnumba.cuda.{name}" for name in OLD_NAMES]
    found = []
    for folder in ("vtnumba", "tests", "benchmarks", "examples", "tools"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "test_cuda_layers.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
                    found += [(str(path.relative_to(root)), n) for n in names if n in old]
                elif isinstance(node, ast.Import):
                    found += [(str(path.relative_to(root)), a.name) for a in node.names if a.name in old]
    assert not found, found


def test_the_old_paths_are_gone():
    """A name from before the split no longer imports, and says so plainly: vtnumba's import hook
    answers for every ``vtnumba.cuda.*`` name, so numba-cuda's redirector (which claims any name
    containing "numba.cuda") never recurses on one."""
    for old in sorted(OLD_NAMES):
        with pytest.raises(ModuleNotFoundError, match=f"No module named 'vtnumba.cuda.{old}'"):
            importlib.import_module(f"vtnumba.cuda.{old}")


def _section(text, heading):
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def _layout_paths(layout):
    """The paths the Layout section's module map names, relative to the repository root: a line's
    leading words ending in '/' or '.py' are a folder or modules, placed under the folders of the
    lines above it by their indentation (two spaces a level); the rest of a line is description."""
    block = re.search(r"```\n(.*?)```", layout, flags=re.S).group(1)
    folders, named = [], set()
    for line in block.splitlines():
        if not line.strip():
            continue
        level = (len(line) - len(line.lstrip(" "))) // 2
        for word in line.split():
            if word.endswith("/"):
                folders[level:] = [word.rstrip("/")]
                named.add("/".join(folders) + "/")
                break  # a folder line names one folder; the rest is description
            if not word.endswith(".py"):
                break
            named.add("/".join(folders[:level] + [word]))
    return named


def test_the_readme_layout_and_architecture_name_the_tree():
    """docs/GUIDE.md's Layout section (the README points there) names every module and package of
    vtnumba, each under its own folder, and none that is gone; ARCHITECTURE.md names every module of
    vtnumba.cuda."""
    root = CUDA.parent.parent
    assert "docs/GUIDE.md" in (root / "README.md").read_text()
    layout = _section((root / "docs" / "GUIDE.md").read_text(), "## Layout")
    architecture = (root / "ARCHITECTURE.md").read_text()
    package = CUDA.parent
    named = _layout_paths(layout)
    tree = {str(p.relative_to(root)) for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    tree |= {
        str(p.parent.relative_to(root)) + "/" for p in package.rglob("__init__.py") if "__pycache__" not in p.parts
    }
    assert len(tree) > 60 and "vtnumba/seam/experts.py" in tree  # non-vacuous
    missing = sorted(tree - named)
    assert not missing, f"docs/GUIDE.md's Layout section does not name {missing}"
    gone = sorted(named - tree)
    assert not gone, f"docs/GUIDE.md's Layout section names what is not in the tree: {gone}"
    for path in sorted(CUDA.rglob("*.py")):
        if path.name != "__init__.py":
            assert path.stem in architecture, f"ARCHITECTURE.md does not name {path.relative_to(package)}"
    for cited in sorted(set(re.findall(r"cuda/[\w/]+\.py", layout + architecture))):
        assert (package / cited).is_file(), f"{cited} is cited but not in the tree"
