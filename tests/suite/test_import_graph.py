"""The host package's imports are a one-way stack: no module imports, directly or through
others (the package's __init__ included), a module that imports it back. Every import
counts, those inside functions too: a lazy import hides a cycle from Python's loader, not
from a reader. Read from the source with ast, nothing imported."""
import ast
import os

HOST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "host")
PKG = "microtrain"


def modules(root=HOST):
    """{dotted name: path} of every module of the package."""
    out = {}
    for d, _, files in os.walk(os.path.join(root, PKG)):
        for f in files:
            if f.endswith(".py"):
                name = os.path.relpath(os.path.join(d, f), root)[:-3].replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = os.path.join(d, f)
    return out


def imported(mods, name, node):
    """The package's modules an import statement of module `name` names (a `from X import y`
    names X.y where that is a module, else X)."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = name.split(".")
        if not mods[name].endswith("__init__.py"):
            base = base[:-1]
        if node.level:
            base = base[:len(base) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        targets = [module + "." + a.name if module + "." + a.name in mods else module for a in node.names]
    return {t for t in targets if t in mods and t != name}


def graph(mods):
    g = {}
    for name, path in mods.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        g[name] = set().union(*[imported(mods, name, n) for n in ast.walk(tree)
                                if isinstance(n, (ast.Import, ast.ImportFrom))] or [set()])
    return g


def cycles(g):
    """The strongly connected sets of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
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
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_host_package_has_no_import_cycle():
    mods = modules()
    assert len(mods) > 40, sorted(mods)         # the walk found the package
    g = graph(mods)
    found = cycles(g)
    assert not found, "import cycles in host/microtrain:\n" + "\n".join(
        "  " + ", ".join(c) + ": " + "; ".join("%s -> %s" % (a, b) for a in c for b in sorted(g[a] & set(c)))
        for c in found)


def test_the_walk_sees_a_cycle_through_a_lazy_import():
    """The check itself: a function-level import that closes a loop is found."""
    g = graph(modules())
    assert "microtrain.compiler" in g["microtrain.api"]
    g["microtrain.lowered"] = g["microtrain.lowered"] | {"microtrain.api"}
    assert any({"microtrain.api", "microtrain.compiler", "microtrain.lowered"} <= set(c) for c in cycles(g))
