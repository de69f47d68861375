"""The layering of Shoal's parts, and a checker that walks every import against it
(docs/architecture.md describes the parts).

Every module belongs to one part; a part may import only the parts it lists. Imports
inside functions count too (a late import is still an arrow); cycles are looked for
among module-level imports (those run when a module loads).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Folder -> the package it installs as (pyproject.toml's package-dir).
FOLDERS = {"shoal": "shoal", "protocol": "shoal.protocol", "transport": "shoal.transport",
           "scheduler": "shoal.scheduler", "nodes": "shoal.nodes"}

# The parts of the `shoal` folder, by subpackage: the command-line tools (`shoal/cli/`)
# and the cluster starters (`shoal/cluster/`) may import any part; the client SDK is
# `shoal/sdk/`; every other module there is `common`: the formats and types nodes and
# clients both read (the request contract, programs, indexes, the output comparator).
TOOL_PACKAGES = ("shoal.cli", "shoal.cluster")
TOOLS = {"shoal", "shoal.examples.w3_data"}  # the package's lazy front door; W3's data maker
SDK_PACKAGES = ("shoal.sdk",)

ALLOWED = {
    "protocol": {"protocol"},
    "transport": {"transport", "protocol"},
    "scheduler": {"scheduler", "protocol"},
    "common": {"common", "protocol"},
    "sdk": {"sdk", "common", "protocol", "transport"},
    "nodes": {"nodes", "common", "protocol", "transport", "scheduler"},
    "worker": {"worker", "nodes", "common", "protocol", "transport", "scheduler"},
    "tools": {"tools", "sdk", "common", "protocol", "transport", "scheduler", "nodes", "worker"},
}


def part_of(module: str) -> str:
    for prefix, part in (("shoal.protocol", "protocol"), ("shoal.transport", "transport"),
                         ("shoal.scheduler", "scheduler"), ("shoal.nodes.worker", "worker"), ("shoal.nodes", "nodes")):
        if module == prefix or module.startswith(prefix + "."):
            return part
    if module in TOOLS or any(module == p or module.startswith(p + ".") for p in TOOL_PACKAGES):
        return "tools"
    return "sdk" if any(module == p or module.startswith(p + ".") for p in SDK_PACKAGES) else "common"


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package: its dotted name -> its file."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in (root / folder).rglob("*.py"):
            rel = path.relative_to(root / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def imports(source: str, name: str, known: set[str]) -> list[tuple[int, str, bool]]:
    """(line, imported shoal module, at module level) for each import in `source`."""
    tree = ast.parse(source)
    top = {id(n) for n in tree.body}
    for n in tree.body:  # module-level try/if blocks run at load too
        if isinstance(n, (ast.Try, ast.If)):
            top |= {id(c) for c in ast.walk(n)}
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                package = name.split(".")[: -node.level] if not name.endswith("__init__") else name.split(".")
                base = ".".join([*package, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            if t == "shoal" or t.startswith("shoal."):
                found.append((node.lineno, t, id(node) in top))
    return found


def violations(root: Path = ROOT) -> list[str]:
    """Every forbidden arrow: 'file:line: part module -> part module'."""
    mods = modules(root)
    out = []
    for name, path in sorted(mods.items()):
        src = part_of(name)
        for line, target, _ in imports(path.read_text(), name, set(mods)):
            dst = part_of(target)
            if dst not in ALLOWED[src]:
                out.append(f"{path.relative_to(root)}:{line}: {src} {name} -> {dst} {target}")
    return out


def cycles(root: Path = ROOT) -> list[list[str]]:
    """Groups of modules that import each other when they load (strongly connected
    components of the module-level import graph, larger than one)."""
    mods = modules(root)
    graph = {name: sorted({t for _, t, top in imports(path.read_text(), name, set(mods)) if top and t in mods})
             for name, path in mods.items()}
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out
