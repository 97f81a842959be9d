#!/usr/bin/env python3
"""Loops between the files of one folder: the file-level companion of tools/layer-deps.py
(includes between layers) and tools/layer-calls.sh (calls between layers).

Inside a folder of src/ (or cli/), file A depends on file B when
  * call:    A's object calls a function B's object defines (from the built objects, as
             tools/layer-calls.sh reads them: build/CMakeFiles/cdf_objects.dir/src/<folder>/*.o;
             a static inline function of a header counts where it is compiled in), or
  * include: A includes a header of the same folder named after B (B.h for B.c).
A header with no .c of its name (nn/nn.h, pipelines/pipeline_impl.h) is a folder's shared
declarations and adds no edge: the calls say who uses whom. A loop is a strongly connected set of
two or more files; each is printed with one edge per step and where it comes from.

  python3 tools/check-file-deps.py [--build build] [--check nn,io] [--quiet] [--calls-only] [--edges nn]

Exit status 1 when a folder named with --check (default: every folder) has a loop. Without a build
only the include edges are used (and a note says so)."""
import argparse, collections, os, re, subprocess, sys

SRC_ROOTS = ["src", "cli"]


def folders(root="."):
    out = {}
    for top in SRC_ROOTS:
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        if top == "cli":
            out["cli"] = base
            continue
        for d in sorted(os.listdir(base)):
            if os.path.isdir(os.path.join(base, d)):
                out[d] = os.path.join(base, d)
    return out


def include_edges(name, path):
    """(a, b) -> why, for a includes "<folder>/b.h" (or "b.h") where b.c exists in the folder."""
    files = [f for f in os.listdir(path) if f.endswith((".c", ".h"))]
    stems_c = {f[:-2] for f in files if f.endswith(".c")}
    edges = {}
    for f in files:
        a = f[:-2]
        text = open(os.path.join(path, f), errors="replace").read()
        for m in re.finditer(r'#include "(?:%s/)?([A-Za-z0-9_]+)\.h"' % re.escape(name), text):
            b = m.group(1)
            if b != a and b in stems_c and os.path.exists(os.path.join(path, b + ".h")):
                edges.setdefault((a, b), f"include: {f} includes {b}.h")
    return edges


def nm(args):
    try:
        return subprocess.run(["nm"] + args, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def call_edges(objdir):
    """(a, b) -> why, for a's object using a global symbol b's object defines."""
    if not os.path.isdir(objdir):
        return None
    objs = {}
    for f in sorted(os.listdir(objdir)):
        if f.endswith(".o"):
            stem = f[:-2]
            stem = stem.rsplit(".", 1)[0]  # x.c.o -> x
            objs[stem] = os.path.join(objdir, f)
    defs = {}
    for stem, o in objs.items():
        for line in nm(["--defined-only", "-g", o]).splitlines():
            p = line.split()
            if len(p) == 3:
                defs.setdefault(p[2], stem)
    edges = {}
    for stem, o in objs.items():
        for line in nm(["-u", o]).splitlines():
            p = line.split()
            if not p:
                continue
            sym = p[-1]
            b = defs.get(sym)
            if b and b != stem:
                edges.setdefault((stem, b), f"call: {stem} calls {sym} ({b})")
    return edges


def loops(edges):
    """Strongly connected sets of >= 2 nodes (Tarjan), each with a cycle through all its nodes'
    edges printed as found."""
    g = collections.defaultdict(set)
    for a, b in edges:
        g[a].add(b)
        g.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                strong(w)
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

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--check", default=None, help="comma-separated folders whose loops fail the check")
    ap.add_argument("--quiet", action="store_true", help="print only the loops")
    ap.add_argument("--calls-only", action="store_true", help="ignore include edges")
    ap.add_argument("--edges", default=None, help="comma-separated folders whose every edge is printed")
    a = ap.parse_args()
    check = set(a.check.split(",")) if a.check else None
    failed = False
    no_objects = []
    for name, path in folders().items():
        e = {}
        objdir = os.path.join(a.build, "CMakeFiles", "cdf_objects.dir", "src", name) if name != "cli" else \
            os.path.join(a.build, "CMakeFiles", "cdiffusers_cli.dir", "cli")
        c = call_edges(objdir)
        if c is None:
            no_objects.append(name)
        else:
            e.update(c)
        if not a.calls_only:
            for k, v in include_edges(name, path).items():
                e.setdefault(k, v)  # a call says more than an include: keep it where both exist
        found = loops(e)
        if a.edges and name in a.edges.split(","):
            for x, y in sorted(e):
                print(f"    {name}: {x} -> {y}: {e[(x, y)]}")
        if not a.quiet:
            print(f"{name:12s} {len(e):3d} edges, " + (f"{len(found)} loop(s)" if found else "no loop"))
        for comp in found:
            inside = sorted((x, y) for (x, y) in e if x in comp and y in comp)
            print(f"loop in {name}: {' <-> '.join(comp)}")
            for x, y in inside:
                print(f"    {x} -> {y}: {e[(x, y)]}")
            if check is None or name in check:
                failed = True
    if no_objects:
        print(f"note: no objects under {a.build} for {', '.join(no_objects)}: include edges only "
              f"(build first for the calls)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
