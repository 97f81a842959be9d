#!/usr/bin/env python3
"""PyTorch side of bench_peers.py: one transformer forward / VAE decode of current diffusers on
current CPU PyTorch, eager (SDPA attention, diffusers' default processor) or torch.compile
(inductor), on the SAME random weights and inputs as the cdiffusers side.

Run with a python that has torch >= 2 and diffusers (e.g. /work/venv/bin/python); nothing is
downloaded: the weights come from the component folder tools/make-random-pipeline wrote
(--model-dir, diffusers layout), the inputs from the safetensors file bench_peers.py wrote.

Prints one `RESULT {json}` line: seconds of every pass (the first = warmup; for --mode compile
it includes inductor's compile), the median of the timed passes, peak RSS (VmHWM), the CPU
time other processes used during the timed passes ("foreign cores") and, with --save, writes
the output tensor (f32) for accuracy comparisons.

    /work/venv/bin/python bench/peers/torch_side.py --case sd35m --model-dir DIR/transformer \
        --inputs in_sd35m.safetensors --dtype f32 --mode eager --threads 2 --repeats 1
"""
import argparse
import json
import os
import statistics
import time


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def busy_seconds():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu():
    t = os.times()
    return t.user + t.system


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=["sd35m", "flux", "vae"], required=True)
    ap.add_argument("--model-dir", required=True, help="diffusers component folder (config.json + safetensors)")
    ap.add_argument("--inputs", required=True, help="safetensors with the forward's inputs (f32)")
    ap.add_argument("--dtype", choices=["f32", "bf16", "bf16mm"], default="f32",
                    help="bf16mm: f32 everywhere except that every Linear/Conv input and attention's q, k, v "
                         "are rounded to bf16 (what cdiffusers' bf16 does: bf16 weights and matmul inputs, f32 "
                         "accumulation and f32 elsewhere); an accuracy reference, not a speed side")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-freezing", action="store_true",
                    help="compile without inductor's freezing (weights as constants, prepacked for oneDNN)")
    ap.add_argument("--save", default=None, help="write the last output (f32) to this safetensors file")
    args = ap.parse_args()

    import torch
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(args.threads)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "bf16mm": torch.float32}[args.dtype]
    rss0 = rss_kib("VmRSS")
    t0 = time.perf_counter()
    if args.case == "sd35m":
        from diffusers import SD3Transformer2DModel as M
    elif args.case == "flux":
        from diffusers import FluxTransformer2DModel as M
    else:
        from diffusers import AutoencoderKL as M
    model = M.from_pretrained(args.model_dir, torch_dtype=dtype).eval()
    load_s = time.perf_counter() - t0
    rss_weights = rss_kib("VmRSS")

    if args.dtype == "bf16mm":
        round_bf16 = lambda t: t.to(torch.bfloat16).to(torch.float32)  # noqa: E731
        for mod in model.modules():
            if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)):
                mod.weight.data = round_bf16(mod.weight.data)
                mod.register_forward_pre_hook(lambda m, inp: (round_bf16(inp[0]),) + tuple(inp[1:]))
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def sdpa_bf16_inputs(q, k, v, *a, **kw):
            return sdpa(round_bf16(q), round_bf16(k), round_bf16(v), *a, **kw)
        torch.nn.functional.scaled_dot_product_attention = sdpa_bf16_inputs

    raw = load_file(args.inputs)
    if args.case == "vae":
        inputs = dict(z=raw["z"].to(dtype))
        fn = lambda **kw: model.decode(**kw, return_dict=False)[0]  # noqa: E731
    else:
        inputs = {k: (v.to(dtype) if k not in ("img_ids", "txt_ids") else v) for k, v in raw.items()}
        if args.case == "flux":
            # diffusers' Flux takes 2-D ids (tokens, 3); the file holds them that way
            pass
        fn = lambda **kw: model(**kw, return_dict=False)[0]  # noqa: E731
    if args.mode == "compile":
        import torch._inductor.config as ic
        # freezing folds the (inference-only) weights into the graph and lets inductor prepack
        # them for oneDNN: PyTorch's recommended CPU inference setting
        ic.freezing = not args.no_freezing
        if args.case == "vae":
            model.decode = torch.compile(model.decode)
        else:
            model = torch.compile(model)

    times, foreign = [], []
    out = None
    with torch.inference_mode():
        for it in range(args.warmup + args.repeats):
            b0, c0, t = busy_seconds(), own_cpu(), time.perf_counter()
            out = fn(**inputs)
            dt = time.perf_counter() - t
            b1, c1 = busy_seconds(), own_cpu()
            times.append(dt)
            if it >= args.warmup:
                foreign.append(max(0.0, (b1 - b0) - (c1 - c0)) / dt)
            print(f"  [{args.case} {args.dtype} {args.mode}] pass {it}{' (warmup)' if it < args.warmup else ''} "
                  f"{dt:.3f}s", flush=True)
    out = out.float()
    assert torch.isfinite(out).all(), "non-finite output"
    if args.save:
        save_file({"out": out.contiguous()}, args.save)
    timed = times[args.warmup:] or times
    rec = dict(system=f"diffusers {__import__('diffusers').__version__} on torch {torch.__version__}",
               case=args.case, dtype=args.dtype, mode=args.mode, threads=args.threads,
               freezing=(args.mode == "compile" and not args.no_freezing),
               cpu_capability=torch.backends.cpu.get_cpu_capability(),
               load_sec=load_s, first_sec=times[0], sec_all=timed, sec_median=statistics.median(timed),
               foreign_cpu_cores=foreign, peak_rss_gib=rss_kib("VmHWM") / 1048576,
               weights_rss_gib=(rss_weights - rss0) / 1048576)
    print("RESULT " + json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
