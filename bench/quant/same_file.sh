#!/bin/sh
# The same transformer files in cdiffusers and stable-diffusion.cpp, in one run (issue #19):
# a FLUX.1-width transformer (2 double + 4 single blocks, random weights; ARCH=flux, default) or
# the whole SD3.5-Medium transformer (ARCH=sd35m) as a bf16 .safetensors in BFL / Stability names
# and as Q8_0 / Q4_K GGUF files written from it by stable-diffusion.cpp's own converter
# (`sd-cli -M convert --type q8_0|q4_K`, city96-style: original names, small tensors F32).
#
#   cdiffusers: `run-model --weights FILE` on each file, compile mode, bf16 compute, 512x512
#   (FLUX: 1024 image + 512 text tokens; SD3.5-M: batch 2 (CFG) of 1024 + 333), 1 compiling +
#   REPEAT timed forwards; peak RSS of the process.
#   sd.cpp:     the shared harness's bench_sdcpp.py on the same dit file (sd-cli txt2img 512x512,
#   --cfg-scale 1, 1 + REPEAT steps, first step not counted; its own text lengths), so
#   the ratio is per FLOP (dit_flops.py, analytic). Its peak RSS includes its CLIP-L and VAE.
#
#   BUILD_DIR=build-rel bench/quant/same_file.sh SDCPP_DIR HARNESS_DIR WORK [rounds] [repeat]
# SDCPP_DIR holds dit.safetensors, clip_l.safetensors, [clip_g.safetensors,] vae.safetensors
# (bench/peers writes it as WORK/sdcpp_ARCH_bf16 with --sides sdcpp); WORK needs bench/peers'
# random folder (models/flux_2d4s or models/sd35m: configs) and inputs (in_ARCH_512.safetensors). Needs sd-cli in SD_CLI
# (SKIP_SDCPP=1: the cdiffusers sides only, once the GGUF files exist).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
sd=$1; harness=$2; work=$3
rounds=${4:-2}
repeat=${5:-3}
py=${PYTHON:-python3}
cli=$build/cdiffusers
sdcli=${SD_CLI:?set SD_CLI to stable-diffusion.cpp\'s sd-cli}
arch=${ARCH:-flux}
case $arch in
flux) model=$work/models/flux_2d4s/transformer pre=dit flops_py="sum(dit_flops.flux_flops(1024, 512, 1, n_double=2, n_single=4))" ;;
sd35m) model=$work/models/sd35m/transformer pre=sd35m_dit flops_py="sum(dit_flops.sd35m_flops(1024, 333, 2))" ;;
*) echo "same_file.sh: ARCH is flux or sd35m" >&2; exit 2 ;;
esac
[ -x "$cli" ] || { echo "same_file.sh: build cdiffusers in $build first" >&2; exit 1; }
for t in q8_0 q4_K; do
    [ -f "$work/${pre}_$t.gguf" ] || "$sdcli" -M convert -m "$sd/dit.safetensors" -o "$work/${pre}_$t.gguf" --type "$t" >/dev/null
    # the harness reads <dir>/dit.safetensors; sd.cpp tells GGUF by its magic, not by the name
    mkdir -p "$work/sdcpp_${arch}_$t"
    for f in clip_l clip_g vae; do
        [ -f "$sd/$f.safetensors" ] && ln -sf "$sd/$f.safetensors" "$work/sdcpp_${arch}_$t/$f.safetensors"
    done
    ln -sf "$work/${pre}_$t.gguf" "$work/sdcpp_${arch}_$t/dit.safetensors"
done
echo "case: $arch; CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $(nproc) cores; flags: $(grep -o -w 'avx2\|avx512f\|avx512_bf16\|avx512_vnni\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "date: $(date -u '+%Y-%m-%d %H:%M') UTC; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
flops_cdf=$("$py" -c "import sys; sys.path.insert(0, '$harness'); import dit_flops; print($flops_py)")
cdf() { # name, weights file
    log=$work/same_file_${arch}_cdf_$1.log
    /usr/bin/time -f 'peak_rss_kb=%M' "$cli" run-model --model "$model" --weights "$2" \
        --inputs "$work/in_${arch}_512.safetensors" --output "$work/same_file_$1.out.safetensors" --force --mode compile \
        --dtype bf16 --repeat $((repeat + 1)) >"$log" 2>&1 || { tail -5 "$log" >&2; exit 1; }
    ms=$(grep -o 'forward_ms=[0-9.]*' "$log" | cut -d= -f2 | tail -n +2 | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    rss=$(grep -o 'peak_rss_kb=[0-9]*' "$log" | cut -d= -f2)
    printf 'cdf    %-5s round %d: %7.2f s/forward (median of %d), %6.1f GFLOP/s, peak RSS %5.2f GiB, load %s\n' "$1" "$r" \
        "$(echo "$ms / 1000" | bc -l)" "$repeat" "$(echo "$flops_cdf / $ms / 1000000" | bc -l)" "$(echo "$rss / 1048576" | bc -l)" \
        "$(cut -d' ' -f1 /proc/loadavg)"
}
sdcpp() { # name, ckpt dir
    out=$("$py" "$harness/bench_sdcpp.py" --sd-cli "$sdcli" --ckpt-dir "$2" --arch "$arch" --res 512 --threads "$(nproc)" \
        --steps $((repeat + 1)) --label "$1" --keep-logs "$work/sdcpp-logs" | sed -n 's/^RESULT //p')
    echo "$out" | "$py" -c "import json,sys; r=json.loads(sys.stdin.read()); print('sd.cpp %-5s round $r: %7.2f s/forward (median of %d), %6.1f GFLOP/s, peak RSS %5.2f GiB (with its text encoders and VAE), rc %d' % ('$1', r['sec_per_forward'] or 0, len(r['step_sec_all']) - 1, r['gflops_per_s'] or 0, r['peak_rss_gib'], r['rc']))"
}
r=1
while [ "$r" -le "$rounds" ]; do
    cdf bf16 "$sd/dit.safetensors"
    cdf q8_0 "$work/${pre}_q8_0.gguf"
    cdf q4_K "$work/${pre}_q4_K.gguf"
    if [ "$r" -eq 1 ] && [ "${SKIP_SDCPP:-0}" != 1 ]; then # sd.cpp once: its runs include text encoding and a VAE decode (about 2 min each)
        sdcpp bf16 "$sd"
        sdcpp q8_0 "$work/sdcpp_${arch}_q8_0"
        sdcpp q4_K "$work/sdcpp_${arch}_q4_K"
    fi
    r=$((r + 1))
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
