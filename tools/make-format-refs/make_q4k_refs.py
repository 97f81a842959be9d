#!/usr/bin/env python3
"""Reference data for cdiffusers' Q4_K encoder (cdf_ggml_quantize(CDF_GGML_Q4_K, ...)).

gguf-py has no Q4_K quantizer (gguf.quants.Q4_K.quantize_blocks raises NotImplementedError), so
the ground truth is ggml's own C reference, quantize_row_q4_K_ref in ggml-quants.c: what
llama-quantize (and city96's GGUF conversion, which goes through it) writes for Q4_K without an
importance matrix. This script compiles that file from a ggml (or llama.cpp) checkout you give it
into a scratch directory, feeds it the rows below one 256-value block at a time and saves inputs
and blocks. No ggml code is kept in cdiffusers; only the small result is committed:

  tests/data/formats/q4k_refs.safetensors   "Q4_K.in" (F32 [n]) and "Q4_K.blocks" (U8 [n/256*144]);
                                            metadata: the ggml commit and the compiler flags

ggml's own build compiles ggml-quants.c into ggml-base without -march flags, so on x86-64 there is
no FMA to contract into; -ffp-contract=off makes that explicit (cdiffusers' dequant.c uses the
same flag). -DNDEBUG: as a release build (the asserts do not change results).

Usage:
  /work/venv/bin/python tools/make-format-refs/make_q4k_refs.py GGML_CHECKOUT [OUT_DIR]
GGML_CHECKOUT is a work tree holding src/ggml-quants.c (ggml) or ggml/src/ggml-quants.c
(llama.cpp), or a bare git directory of either (its HEAD is exported). Needs gcc, numpy and
safetensors.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import save_file

DRIVER = r"""
#include <stdint.h>
#include <stdio.h>
void quantize_row_q4_K_ref(const float *x, void *y, int64_t k);
int main(void) {
    float x[256];
    unsigned char b[144];
    while (fread(x, 4, 256, stdin) == 256) { /* one call per block, as one row of 256 */
        quantize_row_q4_K_ref(x, b, 256);
        fwrite(b, 1, 144, stdout);
    }
    return 0;
}
"""

CFLAGS = ["-O2", "-std=c11", "-ffp-contract=off", "-DNDEBUG", "-ffunction-sections", "-fdata-sections"]


def export_sources(checkout, scratch):
    """Returns (root, commit) where root/src/ggml-quants.c exists."""
    for sub in ("", "ggml"):
        root = os.path.join(checkout, sub)
        if os.path.isfile(os.path.join(root, "src", "ggml-quants.c")):
            commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
            return root, commit or "unknown"
    # a bare git directory: export HEAD's sources
    commit = subprocess.run(["git", "--git-dir", checkout, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    names = subprocess.run(["git", "--git-dir", checkout, "ls-tree", "--name-only", "HEAD"], capture_output=True,
                           text=True, check=True).stdout.split()
    prefix = "ggml/" if "ggml" in names and "src" not in names else ""
    tar = subprocess.run(["git", "--git-dir", checkout, "archive", "HEAD", prefix + "src", prefix + "include"],
                         capture_output=True, check=True).stdout
    subprocess.run(["tar", "x", "-C", scratch], input=tar, check=True)
    return os.path.join(scratch, prefix), commit


def build(root, scratch):
    drv = os.path.join(scratch, "drv.c")
    open(drv, "w").write(DRIVER)
    obj = os.path.join(scratch, "ggml-quants.o")
    inc = ["-I" + os.path.join(root, d) for d in ("include", "src", "src/ggml-cpu")]
    subprocess.run(["gcc", *CFLAGS, *inc, "-c", os.path.join(root, "src", "ggml-quants.c"), "-o", obj], check=True)
    exe = os.path.join(scratch, "q4k")
    # --gc-sections drops the functions that need the rest of ggml (ggml_abort, ...)
    subprocess.run(["gcc", "-O2", drv, obj, "-Wl,--gc-sections", "-o", exe, "-lm"], check=True)
    return exe


def rows(rng):
    """Blocks of 256 values that exercise every branch of the encoder."""
    out = []
    for s in (1e-3, 0.05, 1.0, 30.0):  # plain gaussian rows of several magnitudes
        out += [rng.standard_normal(256) * s for _ in range(3)]
    w = rng.standard_normal(256) * 0.02  # weight-like, with a few outliers
    w[rng.integers(0, 256, 4)] *= 25.0
    out.append(w)
    out.append(np.zeros(256))  # all zero: every sub-block max == min
    out.append(np.full(256, 0.5))  # constant positive: min clipped to 0, scale from max
    out.append(np.full(256, -0.25))  # constant negative: max == min < 0
    out.append(rng.uniform(0.1, 2.0, 256))  # all positive: the offset stays 0
    out.append(rng.uniform(-2.0, -0.1, 256))  # all negative
    z = rng.standard_normal(256)  # zero sub-blocks next to live ones
    z[0:32] = 0.0
    z[96:160] = 0.0
    out.append(z)
    t = rng.standard_normal(256)  # one sub-block so small its coded scale rounds to 0 (d = 0 path)
    t[32:64] *= 1e-4
    t[160:192] *= 1e-3
    out.append(t)
    off = rng.standard_normal(256) * 0.01  # narrow sub-blocks far from 0: large mins, small scales
    for j in range(8):
        off[32 * j:32 * j + 32] += rng.uniform(-8.0, 1.0)
    out.append(off)
    out.append(rng.standard_normal(256) * 1e-6)  # d in f16's subnormal range
    out.append(rng.standard_normal(256) * 1e4)  # large values (d near f16's top)
    out.append(rng.integers(-7, 9, 256).astype(np.float64))  # integers: rounding ties
    out.append(np.tile(np.linspace(-1.0, 1.0, 32), 8))  # evenly spaced grid
    out.append(rng.laplace(size=256) * 0.1)  # heavy tails
    return np.concatenate(out).astype(np.float32)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args:
        sys.exit(__doc__)
    out = args[1] if len(args) > 1 else os.path.join(os.path.dirname(__file__), "../../tests/data/formats")
    x = rows(np.random.default_rng(41))
    with tempfile.TemporaryDirectory() as scratch:
        root, commit = export_sources(os.path.abspath(args[0]), scratch)
        exe = build(root, scratch)
        blocks = subprocess.run([exe], input=x.tobytes(), capture_output=True, check=True).stdout
    assert len(blocks) == x.size // 256 * 144, len(blocks)
    meta = {"ggml_commit": commit, "cflags": " ".join(CFLAGS), "function": "quantize_row_q4_K_ref"}
    save_file({"Q4_K.in": x, "Q4_K.blocks": np.frombuffer(blocks, dtype=np.uint8).copy()},
              os.path.join(out, "q4k_refs.safetensors"), metadata=meta)
    print("wrote", os.path.join(out, "q4k_refs.safetensors"), "from ggml", commit)


if __name__ == "__main__":
    main()
