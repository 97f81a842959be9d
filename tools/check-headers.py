#!/usr/bin/env python3
"""The public headers' rules (include/cdiffusers/*.h), as far as a script can check them:

  * one sub-prefix per header: every function it declares is named cdf_<sub>_... where <sub> is
    the header's own (its file name, or the one SUB below gives), or cdf_<type>_... for a type the
    header itself defines (typedef ... cdf_<type>: cdf_image_free in pipeline.h, the
    cdf_device_mesh_* of dist.h); the names still outside that rule are listed in KNOWN with why,
    and the check fails on any other (and on a KNOWN entry that has gone, so the list only shrinks);
  * no third-party types: no cJSON, libpng, MPI, PJRT or CUDA name, and no #include <...> but the
    C standard library's;
  * one spelling for default parameters: a function whose name says "default" and returns a
    struct is cdf_<type>_default(void) for the struct type <type> it returns.

  python3 tools/check-headers.py [--list]

Exit status 1 on any finding, each printed with its header and line. --list prints every
header's functions by sub-prefix."""
import os, re, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
INC = os.path.join(ROOT, "include", "cdiffusers")

# the header's sub-prefix where it is not the file name
SUB = {"safetensors.h": "st", "cdiffusers.h": None}

# Names outside the rule today, by header, with the reason they stay (fewer is better).
KNOWN = {
    # the op vocabulary: cdf_add, cdf_matmul, cdf_linear, ... are the tensor API itself
    "tensor.h": "ops",
    # the thread's last error: used at nearly every call site of the library
    "error.h": {"cdf_last_error", "cdf_last_status", "cdf_clear_error"},
    # scalar conversions named after the two dtypes (hot in the kernels), and cdf_convert
    "dtype.h": {"cdf_bf16_to_f32", "cdf_f32_to_bf16", "cdf_f16_to_f32", "cdf_f32_to_f16", "cdf_f8e4m3_to_f32",
                "cdf_f8e5m2_to_f32", "cdf_convert"},
    # torch's sampling functions, named as torch names them
    "rng.h": {"cdf_randn_f32", "cdf_randn_bf16", "cdf_randn_f16", "cdf_randn", "cdf_rand_f32", "cdf_rand_f64",
              "cdf_randn_tensor", "cdf_randn_tensor_f32"},
    # a memory size ("8G") for the device budgets; its callers include src/backend/pjrt, being
    # reworked for tensor parallelism: renamed (cdf_device_parse_bytes) with it
    "device.h": {"cdf_parse_bytes"},
    # src/dist is being reworked for tensor parallelism: renamed with it
    "dist.h": {"cdf_all_reduce_sum", "cdf_tp_enable", "cdf_tp_disable", "cdf_tp_mesh"},
}

STD_HEADERS = {"stdbool.h", "stddef.h", "stdint.h", "stdio.h", "stdlib.h", "string.h", "limits.h", "math.h"}
THIRD_PARTY = re.compile(r"\b(cJSON\w*|png_\w+|MPI_\w+|PJRT_\w+|cuda\w*|CUstream\w*|cublas\w*)\b")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def declarations(text):
    """(line, name, return type text) of each function declared at file scope."""
    out = []
    code = strip_comments(text)
    for m in re.finditer(r"(^|[;}\n])\s*((?:const\s+)?(?:struct\s+)?[A-Za-z_][\w\s\*]*?)\b(cdf_\w+)\s*\(", code):
        ret = m.group(2).strip()
        if not ret or ret.startswith(("typedef", "return", "#", "(")) or "(" in ret:
            continue
        name = m.group(3)
        line = code.count("\n", 0, m.start(3)) + 1
        out.append((line, name, ret))
    return out


def types_defined(text):
    code = strip_comments(text)
    names = set(re.findall(r"\btypedef\b[^;]*?\b(cdf_\w+)\s*;", code, flags=re.S))
    names |= set(re.findall(r"\btypedef\s+(?:struct|enum|union)\s+(cdf_\w+)", code))
    return {n[len("cdf_"):] for n in names}


def main():
    listing = "--list" in sys.argv[1:]
    findings = []
    for h in sorted(os.listdir(INC)):
        if not h.endswith(".h"):
            continue
        path = os.path.join(INC, h)
        text = open(path).read()
        rel = os.path.relpath(path, ROOT)
        sub = SUB.get(h, h[:-2])
        types = types_defined(text)
        known = KNOWN.get(h, set())
        seen_known = set()
        for m in re.finditer(r"#include\s*<([^>]+)>", text):
            if m.group(1) not in STD_HEADERS:
                findings.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: includes <{m.group(1)}> (public headers "
                                "include the C standard library's headers only)")
        code = strip_comments(text)
        for m in THIRD_PARTY.finditer(code):
            findings.append(f"{rel}:{code.count(chr(10), 0, m.start()) + 1}: third-party name '{m.group(1)}' in a public header")
        decls = declarations(text)
        if listing:
            groups = {}
            for _, name, _ in decls:
                groups.setdefault("_".join(name.split("_")[:2]), []).append(name)
            print(f"{h}: " + ", ".join(f"{k} {len(v)}" for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))))
        for line, name, ret in decls:
            owners = ([sub] if sub else []) + sorted(types, key=len, reverse=True)
            ok = any(name.startswith(f"cdf_{o}_") or name == f"cdf_{o}" for o in owners)
            if not ok:
                if known == "ops" or name in known:
                    seen_known.add(name)
                else:
                    findings.append(f"{rel}:{line}: {name} is named neither cdf_{sub}_* nor after a type {h} defines")
            if "default" in name and re.match(r"(const\s+)?cdf_\w+$", ret) and ret.startswith("cdf_") and \
                    ret[len("cdf_"):] in types and not name.endswith("_default"):
                findings.append(f"{rel}:{line}: {name} returns {ret}: default parameters are spelled {ret}_default()")
            if name.endswith("_default") and ret.startswith("cdf_") and ret[len("cdf_"):] in types and name != f"{ret}_default":
                findings.append(f"{rel}:{line}: {name} returns {ret}: default parameters are spelled {ret}_default()")
        if known != "ops":
            for gone in sorted(set(known) - seen_known):
                findings.append(f"{rel}: {gone} is listed in KNOWN (tools/check-headers.py) but no longer declared "
                                "outside the rule: take it off the list")
    for f in findings:
        print(f)
    if not findings and not listing:
        print(f"public headers: one sub-prefix each (known exceptions: "
              f"{sum(len(v) for v in KNOWN.values() if v != 'ops')} names + tensor.h's ops), no third-party types, "
              "one default spelling")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
