#!/usr/bin/env python3
"""Interleaved A/B of two athanor binaries on `athanor bench`: for each config and
precision, N pairs of runs, A then B then B then A..., each run its own process, and the
ratio B/A of throughput per pair (> 1: B is faster). Prints the median ratio with its
range, and the medians of each side.

    python3 bench/ab_bench.py --a /path/old/athanor --b build/apps/athanor/athanor \\
        --configs tiny-gpt mlp --precisions f32 bf16 --pairs 5 --steps 15

--env-a / --env-b add environment variables to one side (e.g. ATHANOR_ISA=avx2), so the
same binary can be compared with itself under two settings.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_env(items):
    env = {}
    for kv in items or []:
        k, _, v = kv.partition("=")
        env[k] = v
    return env


def run(binary, config, precision, steps, warmup, extra_env):
    env = dict(os.environ)
    env.update(extra_env)
    cmd = [binary, "bench", os.path.join("bench", "configs", config + ".yaml"), f"trainer.precision={precision}",
           "--json", "--steps", str(steps), "--warmup", str(warmup)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the baseline binary")
    ap.add_argument("--b", required=True, help="the binary under test")
    ap.add_argument("--env-a", nargs="*", help="KEY=VALUE for A's runs")
    ap.add_argument("--env-b", nargs="*", help="KEY=VALUE for B's runs")
    ap.add_argument("--configs", nargs="+", default=["tiny-gpt", "mlp"])
    ap.add_argument("--precisions", nargs="+", default=["f32"])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    env_a, env_b = parse_env(args.env_a), parse_env(args.env_b)
    print("| config | prec | A median | B median | B / A median [min-max] | pairs |")
    print("|---|---|---|---|---|---|")
    for config in args.configs:
        steps = max(args.steps, 100) if config == "mlp" else args.steps
        for precision in args.precisions:
            a_runs, b_runs = [], []
            for i in range(args.pairs):
                order = [("a", args.a, env_a), ("b", args.b, env_b)]
                if i % 2:
                    order.reverse()
                for side, binary, env in order:
                    r = run(binary, config, precision, steps, args.warmup, env)
                    (a_runs if side == "a" else b_runs).append(r["throughput"])
                    print(f"[{config} {precision} pair {i + 1}/{args.pairs}] {side}: {r['throughput']:.0f} {r['unit']}/s",
                          file=sys.stderr, flush=True)
            ratios = [b / a for a, b in zip(a_runs, b_runs)]
            print(f"| {config} | {precision} | {statistics.median(a_runs):,.0f} | {statistics.median(b_runs):,.0f} "
                  f"| {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] | {args.pairs} |", flush=True)


if __name__ == "__main__":
    main()
