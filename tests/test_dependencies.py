"""The library's dependency direction, checked on the source (every import statement, at module level or inside a
function): formats -> layers -> policy -> rl / evaluate -> commands (the CLI), the contracts below everything,
`baselines` only under the policy core and the quantization stage, and no import cycle among qerl's packages. The
front door sits on top: qerl/cli.py only dispatches to qerl/commands, no library module imports qerl.cli or
qerl.commands, and every subcommand is one module there. qerl_kernels depends on qerl only through the format
spec (qerl.formats).

Why a test: the layering is what lets a stage be changed, run and tested alone; an import added in the wrong
direction (the trainer calling the evaluator, a report helper reaching into the trainer) would otherwise go
unnoticed until it became a cycle.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QERL = ROOT / "qerl"

# Ranks along the chain formats -> layers -> policy -> rl / evaluate -> commands: a unit may import units of its own
# rank or below, never above. Units not listed (data, config, report, profiling, ...) are bound by the cycle check.
RANK = {"contract": 0, "formats": 1, "layers": 2, "noise": 2, "policy": 3, "rl": 4, "evaluate": 4, "commands": 5}
BASELINES_ALLOWED = ("policy", "quantize")  # the policy core, and the quantization stage that writes NF4 recipes


def _unit(module: str) -> str | None:
    """"qerl.rl.trainer" -> "rl"; "qerl.config" -> "config"; None outside qerl."""
    parts = module.split(".")
    return parts[1] if parts[0] == "qerl" and len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in a file (`from x import y` also as x.y, for subpackages)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import (the layering check reads absolute ones)"
            found.append((node.module, node.lineno))
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """unit -> units it imports, and every (file:line, importing unit, imported module) of the qerl sources."""
    edges: dict[str, set[str]] = defaultdict(set)
    records = []
    for path in sorted(QERL.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if len(rel.parts) < 3:  # a top-level module, qerl/<name>.py (qerl/__init__.py has no imports)
            src = rel.stem if rel.stem != "__init__" else None
        else:
            src = rel.parts[1]
        for module, line in _imports(path):
            records.append((f"{rel}:{line}", src, module))
            dst = _unit(module)
            if src and dst and dst != src and ((QERL / dst).is_dir() or (QERL / f"{dst}.py").is_file()):
                edges[src].add(dst)
    return edges, records


EDGES, RECORDS = _graph()


def test_the_graph_is_read():
    assert {"policy", "rl", "evaluate", "contract"} <= set(EDGES) | {"contract"}
    assert "policy" in EDGES["rl"] and "rl" in EDGES["evaluate"]  # the edges that must exist, as a sanity check


def test_rl_imports_nothing_from_evaluate():
    bad = [where for where, src, module in RECORDS if src == "rl" and _unit(module) == "evaluate"]
    assert not bad, f"qerl.rl imports qerl.evaluate at {bad}; chain them in the CLI layer (qerl/commands)"


def test_baselines_only_under_the_policy_core_and_quantize():
    bad = [where for where, src, module in RECORDS if module.split(".")[0] == "baselines"
           and src not in BASELINES_ALLOWED]
    assert not bad, f"`baselines` imported outside qerl/{{{','.join(BASELINES_ALLOWED)}}}: {bad}"


def test_baselines_sits_below_the_policy_core():
    units = set()
    for path in (ROOT / "baselines").rglob("*.py"):
        units |= {_unit(module) for module, _ in _imports(path)} - {None}
    assert units <= {"layers", "formats", "contract"}, units


@pytest.mark.parametrize("unit", sorted(RANK), ids=sorted(RANK))
def test_no_import_against_the_chain(unit):
    bad = [(where, module) for where, src, module in RECORDS
           if src == unit and _unit(module) in RANK and RANK[_unit(module)] > RANK[unit]]
    assert not bad, f"qerl.{unit} (rank {RANK[unit]}) imports a unit above it: {bad}"


def test_no_library_module_imports_the_cli():
    bad = [where for where, src, module in RECORDS if src not in ("cli", "commands")
           and (module == "qerl.cli" or module.startswith("qerl.commands"))]
    assert not bad, f"a library module imports the CLI (qerl.cli / qerl.commands): {bad}; the CLI calls the library"


def test_the_cli_only_dispatches_to_commands():
    """qerl/cli.py imports no stage (it names its modules by convention) and each subcommand is one module."""
    from qerl.cli import SUBCOMMANDS, module_name

    units = {_unit(module) for where, src, module in RECORDS if src == "cli"} - {None}
    assert units <= {"args", "jobserver"}, units  # jobserver: hand the command to a DAG run's job server
    for name in SUBCOMMANDS:
        path = ROOT / (module_name(name).replace(".", "/") + ".py")
        assert path.is_file(), f"qerl {name}: no module {path.relative_to(ROOT)}"
    modules = {p.stem for p in (QERL / "commands").glob("*.py")} - {"__init__"}
    assert modules == {module_name(n).rsplit(".", 1)[1] for n in SUBCOMMANDS}, "a module of qerl/commands is no command"


def test_qerl_kernels_takes_only_the_format_spec_from_qerl():
    bad = []
    for path in sorted((ROOT / "qerl_kernels").rglob("*.py")):
        for module, line in _imports(path):
            if module.split(".")[0] == "qerl" and _unit(module) not in (None, "formats"):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not bad, f"qerl_kernels imports qerl beyond qerl.formats: {bad}"


def test_contract_imports_no_other_qerl_unit():
    assert EDGES.get("contract", set()) == set(), EDGES.get("contract")


def test_no_cycle_among_qerl_units():
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(EDGES.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state and (cycle := visit(v)):
                return cycle
        stack.pop()
        state[u] = 2
        return None

    for unit in sorted(EDGES):
        if unit not in state and (cycle := visit(unit)):
            pytest.fail(f"import cycle among qerl units: {' -> '.join(cycle)}")
