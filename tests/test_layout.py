"""The package's structure, checked statically: no import loop (imports inside functions included) between modules
or between packages, and the layers' rules: the engine knows no method or proposer, runtime/ knows no methods,
serve/ knows no kernels, verifier or proposers."""
import ast
import re
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "specmesh"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, known: set[str]) -> set[str]:
    """The specmesh modules a file imports anywhere in it (`from pkg import sub` counts sub)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("specmesh")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specmesh"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs or {node.module}
            if len(subs) < len(node.names):         # names defined in the module itself
                found.add(node.module)
    return found & known


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, set(mods)) - {name} for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_loop_anywhere():
    edges = graph()
    edges.pop("specmesh", None)         # the package's front door re-exports the API; nothing imports it back
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def package(name: str) -> str:
    """specmesh.engine.runner -> specmesh.engine; a module at the package's root is a node of its own."""
    return ".".join(name.split(".")[:2])


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, deps in edges.items():
        out.setdefault(package(name), set()).update(package(d) for d in deps if package(d) != package(name))
    return out


def test_no_import_loop_between_packages():
    edges = package_graph(graph())
    edges.pop("specmesh", None)
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_the_package_graph_sees_imports_inside_functions(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f():\n    from specmesh.engine import runner\n")
    b.write_text("import specmesh.methods.ar\n")
    known = {"specmesh.engine.runner", "specmesh.methods.ar"}
    edges = {"specmesh.methods.loop": imports(a, known), "specmesh.engine.step": imports(b, known)}
    assert find_cycle(package_graph(edges)) is not None


def test_the_cycle_finder_finds_a_loop():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(package: str, forbidden: list[str]) -> list[str]:
    return [f"{m} imports {i}" for m, deps in graph().items() if under(m, package)
            for i in deps if any(under(i, f) for f in forbidden)]


def test_the_engine_knows_no_method_or_proposer():
    assert violations("specmesh.engine", ["specmesh.methods", "specmesh.proposers"]) == []


def test_runtime_knows_no_methods_verifier_or_sampling():
    assert violations("specmesh.runtime", ["specmesh.methods", "specmesh.lossless.verify",
                                           "specmesh.lossless.sampling", "specmesh.proposers"]) == []


def test_serve_knows_no_kernels_verifier_or_proposers():
    assert violations("specmesh.serve", ["specmesh.kernels", "specmesh.lossless.verify", "specmesh.proposers"]) == []


def test_no_module_beside_methods_shares_a_methods_name():
    from specmesh.methods import METHODS
    clashes = [name for name, path in modules().items()
               if not under(name, "specmesh.methods") and path.stem in METHODS]
    assert clashes == []


# what a comment must not carry: it goes stale the day the code changes (measurements belong in docs/results)
RECORD = re.compile(r"\b20\d\d-\d\d-\d\d\b"                     # a date
                    r"|\b\d+\.\d+x\b"                          # a measured ratio, 1.25x
                    r"|\b(Zen ?\d|EPYC|Xeon|Ryzen|Sapphire Rapids|Emerald Rapids|Granite Rapids|Cooper Lake|Ice Lake"
                    r"|Skylake|Cascade Lake|Milan|Genoa|Turin)\b")     # a CPU model


def records(text: str) -> list[str]:
    return [m.group(0) for m in RECORD.finditer(text)]


def test_no_dates_cpu_models_or_measured_ratios_in_the_source():
    found = [f"{p.relative_to(SRC)}:{n}: {hit}" for p in sorted(PACKAGE.rglob("*")) if p.suffix in (".py", ".c", ".h")
             for n, line in enumerate(p.read_text().splitlines(), 1) for hit in records(line)]
    assert found == [], "\n".join(found)


def test_the_record_finder_finds_each_kind():
    assert records("ran 1.31x ar on Zen 4 (2026-11-28)") == ["1.31x", "Zen 4", "2026-11-28"]
    assert records("an Intel Xeon; AMD EPYC; 2x the bytes; gamma 0.5") == ["Xeon", "EPYC"]
