#!/usr/bin/env python3
"""Lists the imports inside the vramtop binary crate (src/) that run up its layers.

The library crates below it cannot import upward at all (the compiler keeps them); inside
the binary crate the layers are these, top first, and a file may import its own layer or
any below it:

    main.rs
    modes/, docs.rs      the commands: loops, `impl Screen`, terminal take-over
    config/              the settings file (layered over the command line)
    cli.rs               the command line
    ui/                  drawing from a borrowed state
    app/, demo/, export/ state and how it changes; talk-mode stories; exporters' formats
    probe/               background workloads over vramtop-alloc
    units.rs, advice.rs  number formatting; how to give what a verdict lacked (flags)

usage: scripts/check-layers.py [--max N]   exit 1 when more than N (default 0) arrows go up
"""
import os
import re
import sys

LAYERS = [
    ["main", "lib"],
    ["modes", "docs"],
    ["config"],
    ["cli"],
    ["ui"],
    ["app", "demo", "export"],
    ["probe"],
    ["units", "advice"],
]
FLOOR = {name: i for i, names in enumerate(LAYERS) for name in names}
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def top_module(rel):
    top = rel.split(os.sep)[0]
    return top[: -len(".rs")] if top.endswith(".rs") else top


def imports(text):
    """Top-level modules named through `crate::`, in `use` lines and paths alike."""
    found = set()
    for m in re.finditer(r"crate::(\{[^}]*\}|[a-z_]+)", text):
        group = m.group(1)
        if group.startswith("{"):
            found.update(re.findall(r"(?:^|[{,]\s*)([a-z_]+)", group))
        else:
            found.add(group)
    return found


def main():
    limit = 0
    if len(sys.argv) == 3 and sys.argv[1] == "--max":
        limit = int(sys.argv[2])
    upward = []
    for dirpath, _, files in os.walk(ROOT):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, ROOT)
            mine = top_module(rel)
            if mine not in FLOOR:
                print(f"{rel}: module '{mine}' has no layer in scripts/check-layers.py")
                return 2
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            for other in sorted(imports(text)):
                if other in FLOOR and FLOOR[other] < FLOOR[mine]:
                    upward.append(f"{rel} -> {other}")
    for line in upward:
        print("upward:", line)
    print(f"{len(upward)} upward import(s), at most {limit} allowed")
    return 1 if len(upward) > limit else 0


if __name__ == "__main__":
    sys.exit(main())
