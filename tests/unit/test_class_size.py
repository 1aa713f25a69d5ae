"""No class on the request path or among the actors holds more than one concern's worth:
at most 15 methods and 15 attributes in any class of ``serve/``, ``actors/`` or
``solaris/online/``, counted over its bases defined in this repository too (a mixin counts;
Ray's, FastAPI's and the standard library's bases do not). Read from the source (AST), so
the count is the same with Ray blocked."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("serve", "actors", "solaris/online")
LIMIT = 15


def _own(node: ast.ClassDef) -> tuple[set[str], set[str], list[str]]:
    """A class body's methods, its attributes (class-level names and every ``self.x``
    assigned in its methods) and the names of its bases."""
    methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    attrs: set[str] = set()
    for n in node.body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            attrs.add(n.target.id)
        elif isinstance(n, ast.Assign):
            attrs |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    for n in ast.walk(node):
        targets = (n.targets if isinstance(n, ast.Assign) else
                   [n.target] if isinstance(n, (ast.AnnAssign, ast.AugAssign)) else [])
        for t in targets:
            for e in ast.walk(t):
                if (isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)
                        and e.value.id == "self"):
                    attrs.add(e.attr)
    bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
             for b in node.bases]
    return methods, attrs, bases


def _classes(root: Path, dirs: tuple[str, ...]) -> dict[str, tuple[str, set[str], set[str], list[str]]]:
    """``file:Class`` -> (name, methods, attributes, bases) of every class under ``dirs``."""
    out = {}
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    out[f"{path.relative_to(root)}:{node.name}"] = (node.name, *_own(node))
    return out


def sizes(root: Path = ROOT, dirs: tuple[str, ...] = CHECKED) -> dict[str, tuple[int, int]]:
    """(methods, attributes) of each class under ``dirs``, over its bases defined in the
    repository (found by name; a name defined twice counts the larger)."""
    everywhere = _classes(root, ("solaris", "serve", "actors", "jobs"))
    by_name: dict[str, tuple[set[str], set[str], list[str]]] = {}
    for name, methods, attrs, bases in everywhere.values():
        known = by_name.get(name)
        if known is None or len(methods) + len(attrs) > len(known[0]) + len(known[1]):
            by_name[name] = (methods, attrs, bases)

    def total(name: str, seen: frozenset) -> tuple[set[str], set[str]]:
        methods, attrs, bases = by_name[name]
        methods, attrs = set(methods), set(attrs)
        for base in bases:
            if base in by_name and base not in seen:
                m, a = total(base, seen | {base})
                methods |= m
                attrs |= a
        return methods, attrs

    out = {}
    for key, (name, methods, attrs, bases) in _classes(root, dirs).items():
        m, a = set(methods), set(attrs)
        for base in bases:
            if base in by_name and base != name:
                bm, ba = total(base, frozenset({name, base}))
                m |= bm
                a |= ba
        out[key] = (len(m), len(a))
    return out


def test_no_class_on_the_request_path_or_among_the_actors_is_over_the_limit():
    over = {k: v for k, v in sizes().items() if max(v) > LIMIT}
    assert not over, "over %d methods or attributes (methods, attributes): %s" % (
        LIMIT, ", ".join(f"{k} {v}" for k, v in sorted(over.items())))


def test_the_count_follows_bases_defined_here(tmp_path):
    """The counter itself: a mixin's methods and attributes count toward the class that
    mixes it in, and a class one over the limit is reported."""
    pkg = tmp_path / "serve"
    pkg.mkdir()
    mixin = "\n".join(f"    def m{i}(self): self.a{i} = {i}" for i in range(10))
    own = "\n".join(f"    def n{i}(self): pass" for i in range(6))
    (pkg / "x.py").write_text(f"class Mixin:\n{mixin}\n\n\nclass Big(Mixin):\n{own}\n")
    got = sizes(tmp_path, ("serve",))
    assert got["serve/x.py:Mixin"] == (10, 10)
    assert got["serve/x.py:Big"] == (16, 10)
