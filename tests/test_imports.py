"""The package's import graph: no module imports another that imports it back (directly or through others),
counting imports inside functions too (a function-local import only hides a circle), and the algorithm core
imports torch and nothing heavier (CONTRIBUTING.md, 'The math stays pure')."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "reinforce_pro"


def imports() -> dict[str, set[str]]:
    """{module: the package modules it imports anywhere in its body} (`from x import y` counts x, or x.y when
    y is a module)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in modules and m not in (name, "reinforce_pro")}
    return graph


def test_no_import_circles():
    graph = imports()
    circles = []

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt == start:
                circles.append(" -> ".join([*path, start]))
            elif nxt not in path:
                walk(start, nxt, [*path, nxt])

    for module in sorted(graph):
        walk(module, module, [module])
    assert circles == []


def test_the_algorithm_core_imports_torch_only():
    heavy = ("ray", "deepspeed", "vllm", "transformers")
    for path in (PACKAGE / "algos").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not [n for n in names if n.split(".")[0] in heavy], path.name


# The package's rooms from the bottom up: a module may import from its own room or from a lower one, never from
# a room beside or above its own (docs/architecture.md, "Layers").
LAYERS = (
    ("flagspec", "procs", "ray_env", "userfile", "serving", "models"),
    ("rewards", "algos"),
    ("experience", "data"),
    ("rollout",),
    ("workers", "agents"),
    ("trainer",),
    ("search",),
    ("selfplay", "integrations", "selfcheck"),
    ("run",),
    ("cli",),
)


def test_no_import_points_up_or_sideways_between_rooms():
    rank = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}
    graph = imports()
    rooms = {name.split(".")[1] for name in graph if name.count(".")}
    assert rooms <= set(rank), f"a room with no layer: {sorted(rooms - set(rank))} (add it to LAYERS)"
    wrong = []
    for module, targets in graph.items():
        if "." not in module:  # the package's own __init__
            continue
        here = module.split(".")[1]
        for target in targets:
            there = target.split(".")[1]
            if there != here and rank[there] >= rank[here]:
                wrong.append(f"{module} -> {target}")
    assert wrong == [], f"imports that point up or sideways: {wrong}"
