#!/usr/bin/env python3
"""Print the include dependencies between the layers of src/ (one folder = one layer) and any
cycle among them. `python3 tools/layer-deps.py` from the repo root; exit status 1 if a cycle
exists among the layers named with --check (default: all).

With --doc docs/ARCHITECTURE.md it also checks the layer list of that document (the code block
under "## Layers"): every layer of src/ is listed, every include goes to a layer listed below
the includer, and the includer's arrow ("-> a, b (calls also: ...)") names it. Exit status 1 on
any mismatch, each printed."""
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

def doc_layers(path):
    """[(layer, text of its entry)] in the order of the document's layer block."""
    text = open(path, encoding="utf-8").read()
    sec = text[text.index("## Layers"):]
    block = sec[sec.index("```") + 3:]
    block = block[:block.index("```")]
    entries = []
    for line in block.splitlines():
        m = re.match(r"(cli/|src/([a-z0-9_]+))", line)
        if m:
            entries.append([m.group(2) or "cli", line])
        elif entries:
            entries[-1][1] += "\n" + line
    return entries

def check_doc(d, where, path):
    entries = doc_layers(path)
    order = [e[0] for e in entries]
    problems = []
    for l in sorted(set(d) | {t for v in d.values() for t in v}):
        if l not in order:
            problems.append(f"{path}: layer {l} is not in the layer list")
    for name, body in entries:
        arrow = body.rsplit("\u2192", 1)[-1].split("(calls also")[0] if "\u2192" in body else ""
        named = set(re.findall(r"[a-z0-9_]+", arrow))
        for t in sorted(d.get(name, ())):
            if t in order and order.index(t) < order.index(name):
                problems.append(f"{path}: {name} includes {t} ({where[(name, t)][0]}), which the list puts above it")
            if t not in named:
                problems.append(f"{path}: {name} includes {t} ({where[(name, t)][0]}), which its arrow does not name")
    return problems

if __name__ == "__main__":
    d, where = deps()
    layers = set(sys.argv[sys.argv.index("--check") + 1].split(",")) if "--check" in sys.argv else set(d) | {t for v in d.values() for t in v}
    for l in sorted(set(d) | {t for v in d.values() for t in v}):
        print(f"{l:12s} -> {', '.join(sorted(d[l])) or '(nothing)'}")
    cs = cycles(d, layers)
    for c in cs:
        edges = " ; ".join(f"{a}->{b} ({where[(a, b)][0]})" for a, b in zip(c, c[1:]))
        print("cycle:", " -> ".join(c), "|", edges)
    problems = check_doc(d, where, sys.argv[sys.argv.index("--doc") + 1]) if "--doc" in sys.argv else []
    for p in problems:
        print(p)
    sys.exit(1 if cs or problems else 0)
