"""The layers of scalelab point one way, and no module reaches into another package's private names.

Every runtime import between scalelab's packages is read from the source (imports under `if TYPE_CHECKING:` are
annotations, not dependencies). A package may import its own modules, packages of a lower layer, and the base.
Run as a script to print the layers and every edge that breaks them:

    python tests/unit/test_layers.py [SRC_DIR]
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# Higher layers may import lower ones, never the other way round. A module of the package root (config.py) is its
# own package here.
LAYERS = [
    ("cli", "probe", "lightning"),  # probe, lightning: the public APIs a user's script imports
    ("experiments",),  # one module per experiment
    ("perf",),  # the performance model: its calibration and prediction run cells
    ("lab",),  # the cell engine, the experiment registry and the study
    ("report",),
    ("run",),
    ("train",),
    ("config",),  # the run's description: validated against the registries of the layers below
    ("engines",),  # ddp / horovod: a rank's communicator and gradient sync, built on the sync layer
    ("sync", "measure", "zoo", "install"),
    ("analysis",),  # pure functions over plain data
    ("store",),
    ("errors", "distenv", "provenance", "sizes", "registry"),
]
ENTRY = {"__main__", "__init__"}  # the entry point and the package marker belong to no layer


# Flat modules of scalelab 0.1 and the layer their code belongs to (to read an old tree with the same rule).
FLAT = {"launch": "run", "runner": "run", "watchdog": "run", "worker": "run"}


def package_of(module: str) -> str:
    """`scalelab.run.execute` -> "run"; `scalelab.cli_study` -> "cli" (the flat CLI modules of 0.1)."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else parts[0]
    return "cli" if name.startswith("cli") else FLAT.get(name, name)


def rank(package: str) -> int | None:
    for i, names in enumerate(LAYERS):
        if package in names:
            return len(LAYERS) - i
    return None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, module: str) -> list[tuple[str, list[str]]]:
    """(imported scalelab module, names taken from it) for every runtime import in the file."""
    out: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names if a.name.startswith("scalelab"))
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[: -node.level]
                target = ".".join([*base, target] if target else base)
            if target.startswith("scalelab"):
                out.append((target, [a.name for a in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return out


def edges(src: Path = SRC) -> list[tuple[str, str, list[str]]]:
    """(importing module, imported module, names) over every module under src/scalelab."""
    out = []
    for path in sorted((src / "scalelab").rglob("*.py")):
        module = ".".join(path.relative_to(src).with_suffix("").parts)
        out += [(module, target, names) for target, names in imports(path, module)]
    return out


def violations(src: Path = SRC) -> tuple[list[str], list[str], list[str]]:
    """(upward edges, private names taken from another package, packages in no layer)."""
    upward, private, unknown = [], [], set()
    for module, target, names in edges(src):
        a, b = package_of(module), package_of(target)
        if module.split(".")[-1] in ENTRY and module.count(".") == 1 or a == b:
            continue
        ra, rb = rank(a), rank(b)
        for p, r in ((a, ra), (b, rb)):
            if r is None and p != "scalelab":
                unknown.add(p)
        if ra is not None and rb is not None and rb > ra:
            upward.append(f"{module} -> {target} ({a} imports {b}, a higher layer)")
        for name in names:
            if name.startswith("_") and not name.startswith("__"):
                private.append(f"{module} -> {target}.{name}")
    return upward, private, sorted(unknown)


def test_every_package_has_a_layer():
    assert violations()[2] == []


def test_layers_point_one_way():
    upward, _, _ = violations()
    assert upward == []


def test_no_module_imports_a_private_name_of_another_package():
    _, private, _ = violations()
    assert private == []


def test_the_report_reads_results_and_files_not_the_engine_or_the_runs():
    """The report renders saved results (lab.results) and stored files: it imports neither the cell engine (lab),
    the experiments, the model (perf) nor the run layer (run, train)."""
    reached = {package_of(target) for module, target, _ in edges() if package_of(module) == "report"}
    assert reached & {"lab", "experiments", "perf", "run", "train"} == set(), reached


def test_the_checker_sees_an_upward_edge_and_a_private_import(tmp_path):
    pkg = tmp_path / "scalelab"
    (pkg / "store").mkdir(parents=True)
    (pkg / "store" / "catalog.py").write_text("from scalelab.cli.main import _helper\n")
    (pkg / "run").mkdir()
    (pkg / "run" / "x.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from scalelab.lab import cells\n")
    upward, private, _ = violations(tmp_path)
    assert upward == ["scalelab.store.catalog -> scalelab.cli.main (store imports cli, a higher layer)"]
    assert private == ["scalelab.store.catalog -> scalelab.cli.main._helper"]


if __name__ == "__main__":
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else SRC
    upward, private, unknown = violations(src)
    print("layers, top to bottom:", " > ".join("{" + ", ".join(n) + "}" for n in LAYERS))
    print(f"modules: {len(list((src / 'scalelab').rglob('*.py')))}, scalelab import edges: {len(edges(src))}")
    print(f"upward edges: {len(upward)}")
    print("\n".join("  " + e for e in upward))
    print(f"private names imported across packages: {len(private)}")
    print("\n".join("  " + e for e in private))
    if unknown:
        print("packages in no layer:", ", ".join(unknown))
