#!/usr/bin/env python3
"""Lists import circles between the files of every crate (src/ and crates/*/src/): each
`crate::`, `super::` and `self::` path in a file (tests left out) is resolved to the file
that defines the module it names (the longest prefix that is a file), and every set of
files that import each other round a circle is printed. A module's parent (the file that
declares it) is not an import. `scripts/check-layers.py` keeps the binary crate's layers;
this keeps the files inside each crate from tying themselves in knots (issue 39).

usage: scripts/check-circles.py [SRC_DIR...]   exit 1 when there is a circle
"""
import glob
import os
import re
import sys

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super|self)::\{([^}]*)\}")


def module_files(src):
    """Module path (a tuple) -> its file, for every .rs file under `src`."""
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                parts = os.path.relpath(path, src)[:-3].split(os.sep)
                if parts[-1] == "mod":
                    parts = parts[:-1]
                if parts in (["main"], ["lib"]):
                    parts = []
                files[tuple(parts)] = path
    return files


def imports(src):
    """Module -> the modules (files) its code names, outside its tests."""
    files = module_files(src)
    edges = {}
    for module, path in files.items():
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = re.sub(r"//[^\n]*", "", fh.read()).split("#[cfg(test)]")[0]
        refs = PATH.findall(text)
        for head, inner in GROUP.findall(text):
            refs += [(head, "::" + x.strip().split("::")[0]) for x in inner.split(",") if x.strip()]
        named = set()
        for head, tail in refs:
            parts = [p for p in tail.split("::") if p]
            start = () if head == "crate" else module if head == "self" else module[:-1]
            while parts and parts[0] == "super":
                start, parts = start[:-1], parts[1:]
            full = start + tuple(parts)
            for k in range(len(full), 0, -1):
                if full[:k] in files and full[:k] != module:
                    named.add(full[:k])
                    break
        # The file that declares a module is its parent, not an import of it.
        edges[module] = {m for m in named if not (len(m) < len(module) and module[: len(m)] == m)}
    return files, edges


def circles(nodes, edges):
    """Strongly connected sets of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def main():
    dirs = sys.argv[1:] or [os.path.join(REPO, "src")] + sorted(glob.glob(os.path.join(REPO, "crates", "*", "src")))
    total = 0
    for src in dirs:
        files, edges = imports(src)
        for part in circles(files, edges):
            total += 1
            names = ", ".join(os.path.relpath(files[m], REPO) for m in part)
            print(f"circle: {names}")
    print(f"{total} import circle(s) between files")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
