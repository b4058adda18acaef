"""The layout rules of ARCHITECTURE.md, held by a test instead of claimed.

Each rule reads the source as text (``ast``), never imports it. Where today's code breaks a
rule the exception is listed here with its reason; the lists are a ratchet: they may only
shrink (a test fails when an entry is no longer needed, so a fixed exception is removed).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("mesh", "storage", "tools", "bench")
CORES = ("mesh.gossip", "mesh.raft", "mesh.groups", "mesh.cluster")
CORE_MAY_IMPORT = CORES + ("mesh.wire",)
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100

# The public client API that tools/ and bench/ are written against, as a user would.
PUBLIC = ("mesh.client", "mesh.wire", "mesh.spark", "mesh.testing", "mesh.security.creds",
          "mesh.kafka.client_config")
# (module, imported prefix): why it may reach further.
NOT_PUBLIC_ALLOWED = {
    ("tools/cli.py", "mesh.node"): "`mesh node` runs a broker in this process",
    ("tools/acl_cli.py", "mesh.security"): "parses ACL specs and user keys with the broker's own rules",
    ("tools/security_cli.py", "mesh.security"): "`mesh security` makes curve keys and checks a creds file",
    ("bench/metadata_scale.py", "mesh.cluster"): "builds 100,000 partitions' metadata straight into gossip state",
    ("bench/metadata_scale.py", "mesh.gossip"): "builds 100,000 partitions' metadata straight into gossip state",
    ("bench/replication.py", "mesh.security"): "makes the secured cluster's keys",
    ("bench/group_commits.py", "mesh.groups"): "times the bare GROUP_COMMIT at the group's coordinator",
    ("bench/kafka_convert.py", "mesh.kafka"): "times the Kafka listener's record conversion in-process",
}
# Ratchets: today's modules and functions over the bounds (path -> lines at most).
LONG_MODULES = {
    "mesh/raft/manager.py": 707,
}
LONG_FUNCTIONS = {
    ("bench/report.py", "write_report"): 112,
    ("mesh/client/producer.py", "_io_loop"): 136,
}


def _modules():
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/node_modules/" in rel:
                continue
            yield rel, path.read_text(encoding="utf-8")


def _dotted(rel: str) -> str:
    name = rel[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _imports(rel: str, tree: ast.AST):
    """Absolute names imported by a module (relative imports resolved)."""
    pkg = _dotted(rel) if rel.endswith("__init__.py") else _dotted(rel).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield node.lineno, mod


PARSED = [(rel, src, ast.parse(src, rel)) for rel, src in _modules()]
STDLIB = set(sys.stdlib_module_names)


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_cores_import_only_the_standard_library_the_wire_and_each_other():
    bad = []
    for rel, _, tree in PARSED:
        if not _under(_dotted(rel), CORES):
            continue
        for line, name in _imports(rel, tree):
            top = name.split(".")[0]
            if top in STDLIB or top == "__future__" or _under(name, CORE_MAY_IMPORT):
                continue
            bad.append(f"{rel}:{line} imports {name}")
    assert not bad, "a pure core reaches outside the cores:\n" + "\n".join(bad)


def test_nothing_outside_tests_imports_tests():
    bad = [f"{rel}:{line} imports {name}" for rel, _, tree in PARSED
           for line, name in _imports(rel, tree) if _under(name, ("tests",))]
    assert not bad, "\n".join(bad)


def test_tools_and_bench_use_the_public_client_api():
    bad, used = [], set()
    for rel, _, tree in PARSED:
        if not rel.startswith(("tools/", "bench/")):
            continue
        for line, name in _imports(rel, tree):
            if not _under(name, ("mesh",)) or name == "mesh" or _under(name, PUBLIC):
                continue
            key = next((k for k in NOT_PUBLIC_ALLOWED if k[0] == rel and _under(name, (k[1],))), None)
            if key is None:
                bad.append(f"{rel}:{line} imports {name}")
            used.add(key)
    assert not bad, "tools/ and bench/ must use the public client API " \
                    f"({', '.join(PUBLIC)}) or list a reason in NOT_PUBLIC_ALLOWED:\n" + "\n".join(bad)
    stale = set(NOT_PUBLIC_ALLOWED) - used
    assert not stale, f"exceptions no longer needed, remove them: {sorted(stale)}"


def _package(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "mesh" and len(parts) > 1 else parts[0]


def test_no_import_cycle_between_packages():
    ours = {_package(_dotted(rel)) for rel, _, _ in PARSED}
    graph: dict[str, set[str]] = {p: set() for p in ours}
    for rel, _, tree in PARSED:
        src = _package(_dotted(rel))
        for _, name in _imports(rel, tree):
            dst = _package(name)
            if dst in ours and dst != src and name not in ("mesh",):
                graph[src].add(dst)
    # Tarjan's strongly connected components
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not sccs, f"import cycles between packages: {sccs}"


def test_no_module_over_the_line_bound():
    over, seen = [], {}
    for rel, src, _ in PARSED:
        n = len(src.splitlines())
        if n > MAX_MODULE_LINES:
            seen[rel] = n
            if n > LONG_MODULES.get(rel, MAX_MODULE_LINES):
                over.append(f"{rel}: {n} lines (bound {LONG_MODULES.get(rel, MAX_MODULE_LINES)})")
    assert not over, "split these modules (a file past a few hundred lines that mixes concerns " \
                     "is two files):\n" + "\n".join(over)
    shrunk = sorted(set(LONG_MODULES) - set(seen))
    assert not shrunk, f"these are within {MAX_MODULE_LINES} lines now: remove them from LONG_MODULES: {shrunk}"


def test_no_function_over_the_line_bound():
    over, seen = [], set()
    for rel, _, tree in PARSED:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    seen.add((rel, node.name))
                    bound = LONG_FUNCTIONS.get((rel, node.name), MAX_FUNCTION_LINES)
                    if n > bound:
                        over.append(f"{rel}:{node.lineno} {node.name}: {n} lines (bound {bound})")
    assert not over, "\n".join(over)
    shrunk = sorted(set(LONG_FUNCTIONS) - seen)
    assert not shrunk, f"within {MAX_FUNCTION_LINES} lines now: remove from LONG_FUNCTIONS: {shrunk}"


def test_module_level_definitions_are_used():
    """A module-level function or class that nothing names anywhere (source or tests) and
    that is not exported is dead code."""
    corpus = "\n".join(src for _, src, _ in PARSED)
    corpus += "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "tests").rglob("*.py")))
    corpus += (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    dead = []
    for rel, src, tree in PARSED:
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
                registered = bool(getattr(node, "decorator_list", None))   # click commands, @message
                if registered or name.startswith("__") or corpus.count(name) > 1:
                    continue
                dead.append(f"{rel}:{node.lineno} {name}")
    assert not dead, "defined and never used:\n" + "\n".join(dead)
