#!/usr/bin/env python3
"""Where a process's resident memory goes, over time: runs a command and samples its
/proc/PID/status every --interval s (VmRSS = RssAnon + RssFile + RssShmem, VmHWM), timestamps
each line the command prints, and reports the samples around the peak: RssAnon is heap (weights
copied to the device, prepacked copies, activations), RssFile is file pages mapped into the
process (the mmapped checkpoint while it is being read).

    python3 bench/peers/rss_phases.py [--interval 0.2] [--csv trace.csv] -- \
        build/cdiffusers run-model --model DIR --inputs in.safetensors --output o.safetensors --repeat 2
"""
import argparse
import os
import subprocess
import sys
import threading
import time


def status(pid):
    d = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    d[k] = int(v.split()[0]) / 1048576  # GiB
    except OSError:
        pass
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--csv", default=None, help="write every sample (t, VmRSS, RssAnon, RssFile, VmHWM)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        ap.error("no command")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    events = []

    def reader():
        for line in p.stdout:
            events.append((time.perf_counter() - t0, line.rstrip()))
            sys.stdout.write(line)

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    samples = []
    while p.poll() is None:
        s = status(p.pid)
        if s:
            samples.append((time.perf_counter() - t0, s))
        time.sleep(a.interval)
    th.join()
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("t,VmRSS,RssAnon,RssFile,VmHWM\n")
            for t, s in samples:
                f.write(f"{t:.2f},{s.get('VmRSS', 0):.3f},{s.get('RssAnon', 0):.3f},{s.get('RssFile', 0):.3f},"
                        f"{s.get('VmHWM', 0):.3f}\n")
    if not samples:
        print("no samples (the command ended too fast)")
        return p.returncode
    peak_t, peak = max(samples, key=lambda x: x[1].get("VmRSS", 0))
    print(f"\nexit {p.returncode}; {len(samples)} samples; VmHWM {samples[-1][1].get('VmHWM', 0):.2f} GiB")
    print(f"max RssAnon {max(s.get('RssAnon', 0) for _, s in samples):.2f} GiB, "
          f"max RssFile {max(s.get('RssFile', 0) for _, s in samples):.2f} GiB")
    print(f"at the sampled VmRSS peak (t={peak_t:.1f} s): VmRSS {peak.get('VmRSS', 0):.2f} = RssAnon "
          f"{peak.get('RssAnon', 0):.2f} + RssFile {peak.get('RssFile', 0):.2f} + RssShmem {peak.get('RssShmem', 0):.2f} GiB")
    # memory at each printed line (the command's own phase markers)
    for t, line in events:
        before = [s for ts, s in samples if ts <= t]
        if before:
            s = before[-1]
            print(f"  t={t:7.1f} s  RssAnon {s.get('RssAnon', 0):6.2f}  RssFile {s.get('RssFile', 0):6.2f}  | {line[:100]}")
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
