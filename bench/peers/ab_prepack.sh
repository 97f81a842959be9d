#!/bin/bash
# bench/peers/ab_prepack.sh: alternating default prepack cap vs CDIFFUSERS_PREPACK_MB=0, FLUX 2d4s 512 forward, compile mode
B=${B:-build/cdiffusers}; W=${W:-/work/peers/w}  # W: bench_peers.py --work (its models and inputs)
for r in 1 2 3; do
  for mb in default 0; do
    if [ $mb = default ]; then e=""; else e="CDIFFUSERS_PREPACK_MB=0"; fi
    /usr/bin/time -f "maxrss_kb=%M" env OMP_NUM_THREADS=2 $e $B run-model --model $W/models/flux_2d4s/transformer --inputs $W/in_flux_512.safetensors --output /tmp/ab_out_$mb.safetensors --force --repeat 3 --mode compile --dtype bf16 --threads 2 > /tmp/ab_$mb.$r.txt 2>&1
    echo "round $r prepack=$mb $(grep -o 'forward_ms=[0-9.]*' /tmp/ab_$mb.$r.txt | tr '\n' ' ') $(grep maxrss /tmp/ab_$mb.$r.txt) load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
