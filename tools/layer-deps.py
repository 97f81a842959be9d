#!/usr/bin/env python3
"""Print the include dependencies between the layers of src/ (one folder = one layer) and any
cycle among them. `python3 tools/layer-deps.py` from the repo root; exit status 1 if a cycle
exists among the layers named with --check (default: all)."""
import collections, itertools, os, re, sys

def deps(root="src"):
    d = collections.defaultdict(set)
    where = collections.defaultdict(list)
    for base, _, files in os.walk(root):
        for f in files:
            if not f.endswith((".c", ".h", ".cu")):
                continue
            path = os.path.join(base, f)
            layer = os.path.relpath(path, root).split(os.sep)[0]
            for m in re.finditer(r'#include "([a-z0-9_]+)/', open(path, errors="replace").read()):
                target = m.group(1)
                if target != layer and os.path.isdir(os.path.join(root, target)):
                    d[layer].add(target)
                    where[(layer, target)].append(path)
    return d, where

def cycles(d, layers):
    found = []
    def walk(start, node, path):
        for n in sorted(d[node]):
            if n not in layers:
                continue
            if n == start:
                found.append(path + [n])
            elif n not in path and n > start:
                walk(start, n, path + [n])
    for s in sorted(layers):
        walk(s, s, [s])
    return found

if __name__ == "__main__":
    d, where = deps()
    layers = set(sys.argv[sys.argv.index("--check") + 1].split(",")) if "--check" in sys.argv else set(d) | {t for v in d.values() for t in v}
    for l in sorted(set(d) | {t for v in d.values() for t in v}):
        print(f"{l:12s} -> {', '.join(sorted(d[l])) or '(nothing)'}")
    cs = cycles(d, layers)
    for c in cs:
        edges = " ; ".join(f"{a}->{b} ({where[(a, b)][0]})" for a, b in zip(c, c[1:]))
        print("cycle:", " -> ".join(c), "|", edges)
    sys.exit(1 if cs else 0)
