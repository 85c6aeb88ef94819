#!/usr/bin/python3
"""Side by side: athanor vs PyTorch (out of the box and tuned) on the same model,
batch, optimizer and precision, in one invocation (issue 7).

    /usr/bin/python3 bench/compare_pytorch.py                   # all configs, f32 and bf16
    /usr/bin/python3 bench/compare_pytorch.py --quick --configs tiny-gpt mlp
    /usr/bin/python3 bench/compare_pytorch.py --configs gpt2-124m --precisions bf16 --repeats 5 --steps 5

For each config and precision, each repeat runs the three engines one after the
other, each in its own subprocess and environment, rotating the order between
repeats so that the machine's noise is spread over all of them:
  athanor        `athanor bench CONFIG trainer.precision=P --json` (oneDNN; the
                 environment as it is, OMP_NUM_THREADS=2)
  torch-default  bench/pytorch_step.py with the environment as it is (this workplace
                 presets OPENBLAS_CORETYPE=Haswell), torch.set_num_threads(2)
  torch-tuned    the same with what an expert sets: OPENBLAS_CORETYPE=SkylakeX,
                 OMP_WAIT_POLICY=PASSIVE, glibc malloc kept from returning memory
                 (MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_ at its 32 MiB maximum,
                 MALLOC_TOP_PAD_), ATEN_CPU_CAPABILITY=avx512 (--tuned-capability)
Each run reports the throughput at its median step time; the table gives, per engine,
the median over repeats with min-max, and the ratios athanor/torch computed per
repeat (paired runs) with their median and range. MFU is against this CPU's theoretical
peak for the precision, which athanor derives (backend/cpu/cpu_peak.h: cores in use x FMA
units x vector lanes x 2 flops x the measured clock; AMX or AVX512_BF16 for bf16) and reports
in its JSON; the same peak for all three engines. --emulate LEVEL runs every engine as on a
smaller CPU of the same kind (athanor's kernels capped with ATHANOR_ISA, oneDNN with
ONEDNN_MAX_CPU_ISA for athanor and PyTorch alike): avx512 stands for an Intel Xeon without
AVX512_BF16 or AMX, avx2 for a Zen 3.
Prints a Markdown table for bench/RESULTS.md; --out FILE keeps every raw result.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ALL_CONFIGS = ["tiny-gpt", "small-gpt", "gpt2-124m", "llama-124m", "mlp"]
ENGINES = ["athanor", "torch-default", "torch-tuned"]
# ONEDNN_MAX_CPU_ISA for each --emulate level (oneDNN's names), and the ATen capability that matches.
EMULATE = {"avx512": ("AVX512_CORE_VNNI", "avx512"), "avx2": ("AVX2", "avx2")}
# At least these (timed, warm-up) step counts per config, whatever --steps/--warmup/--quick say:
# 10 MLP steps are ~50 ms of timed work, within the machine's noise; and PyTorch's allocator
# needs warm-up steps on gpt2-124M (after 2, tuned bf16 still took ~400k page faults per step
# and ran at 170-215 tok/s, against ~530 after 3; after 3, it still did in 3 of 5 repeats of one
# session-8 run, hence 5).
MIN_STEPS = {"mlp": (100, 10), "gpt2-124m": (3, 5), "llama-124m": (3, 5)}
# A tuned PyTorch run above this many page faults per step is not in its steady state (its
# gpt2-124M steps take 0-55k in bf16 and 120-150k in f32, where tensors above glibc's 32 MiB
# mmap threshold are mapped afresh; a bf16 run still faulting took ~460k and ran 2-3x slower):
# the table then also gives the ratio over the repeats where it ran clean.
FAULTING = 300_000


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def environments(threads, capability, emulate):
    base = dict(os.environ)
    base["OMP_NUM_THREADS"] = str(threads)
    if emulate:
        base["ONEDNN_MAX_CPU_ISA"] = EMULATE[emulate][0]
        capability = EMULATE[emulate][1] if capability else capability
    tuned = dict(base)
    tuned.update({
        "OPENBLAS_CORETYPE": "SkylakeX",
        "OMP_WAIT_POLICY": "PASSIVE",
        "MALLOC_TRIM_THRESHOLD_": str(1 << 40),   # never trim the heap top
        "MALLOC_MMAP_THRESHOLD_": str(32 << 20),  # glibc's maximum: blocks below stay on the reused heap
        "MALLOC_TOP_PAD_": str(1 << 30),          # grow the heap in large steps
    })
    if capability:
        tuned["ATEN_CPU_CAPABILITY"] = capability
    # Diagnostic (--athanor-env): athanor under the settings the library should apply itself
    # (passive OpenMP waiting; glibc keeping freed memory) - what fixing issue 7's findings gives.
    athanor_env = dict(base)
    athanor_env.update({"OMP_WAIT_POLICY": "PASSIVE", "MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
                        "MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TOP_PAD_": str(64 << 20)})
    athanor = dict(base)
    if emulate:
        athanor["ATHANOR_ISA"] = emulate
        athanor_env["ATHANOR_ISA"] = emulate
    return {"athanor": athanor, "athanor-env": athanor_env, "torch-default": base, "torch-tuned": tuned}


def steps_for(name, args):
    lo_steps, lo_warmup = MIN_STEPS.get(name, (0, 0))
    return max(args.steps, lo_steps), max(args.warmup, lo_warmup)


def run_one(engine, cfg_path, precision, args, envs):
    steps, warmup = steps_for(os.path.basename(cfg_path)[:-len(".yaml")], args)
    if engine.startswith("athanor"):
        cmd = [args.athanor, "bench", cfg_path, f"trainer.precision={precision}", "--json",
               "--steps", str(steps), "--warmup", str(warmup)]
    else:
        cmd = [sys.executable, os.path.join(HERE, "pytorch_step.py"), cfg_path, "--precision", precision,
               "--steps", str(steps), "--warmup", str(warmup), "--threads", str(args.threads),
               "--label", engine]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=envs[engine], capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise SystemExit(f"{engine} failed on {cfg_path} ({precision}), exit {p.returncode}:\n"
                         f"  {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-4000:]}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise SystemExit(f"{engine} printed no JSON on {cfg_path}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    r = json.loads(lines[-1])
    r["engine"] = engine
    r["wall_s"] = time.time() - t0
    return r


def fmt_rate(v):
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def spread(values):
    return statistics.median(values), min(values), max(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=None, help=f"names in bench/configs (default: {' '.join(ALL_CONFIGS)})")
    ap.add_argument("--precisions", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-default", action="store_true",
                    help="leave out torch-default (the ratio that matters is against torch-tuned; default PyTorch is the slowest run)")
    ap.add_argument("--quick", action="store_true", help="2 repeats of 3 steps after 2 warm-up steps (tiny GPT and MLP by default)")
    ap.add_argument("--athanor", default=os.path.join(ROOT, "build", "apps", "athanor", "athanor"))
    ap.add_argument("--tuned-capability", default=None,
                    help="ATEN_CPU_CAPABILITY for torch-tuned ('' = leave unset; default: avx512 where the CPU has it, else avx2)")
    ap.add_argument("--emulate", choices=sorted(EMULATE), default=None,
                    help="run all engines as on a smaller CPU: ISA caps for athanor's kernels and oneDNN (see above)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per subprocess")
    ap.add_argument("--athanor-env", action="store_true",
                    help="also run athanor with OMP_WAIT_POLICY=PASSIVE and glibc malloc tuning (diagnostic column)")
    ap.add_argument("--peak-f32", type=float, default=0, help="MFU denominator, GFLOP/s (0 = the CPU's peak as athanor derives it)")
    ap.add_argument("--peak-bf16", type=float, default=0, help="MFU denominator, GFLOP/s (0 = the CPU's peak as athanor derives it)")
    ap.add_argument("--out", default=None, help="write every raw result as JSON here")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup = 2, 3, 2
        args.configs = args.configs or ["tiny-gpt", "mlp"]
    args.configs = args.configs or ALL_CONFIGS
    if not os.access(args.athanor, os.X_OK):
        raise SystemExit(f"no athanor binary at {args.athanor}; build it (cmake --build build) or pass --athanor PATH")
    if args.tuned_capability is None:
        args.tuned_capability = "avx512" if "avx512f" in cpu_flags() else "avx2"
    envs = environments(args.threads, args.tuned_capability, args.emulate)
    engines = [e for e in ENGINES if not (args.skip_default and e == "torch-default")]
    engines += ["athanor-env"] if args.athanor_env else []

    raw, rows = [], []
    for name in args.configs:
        cfg_path = os.path.join("bench", "configs", name + ".yaml")
        if not os.path.exists(os.path.join(ROOT, cfg_path)):
            raise SystemExit(f"no config {cfg_path}; choose from {', '.join(ALL_CONFIGS)}")
        for precision in args.precisions:
            runs = {e: [] for e in engines}
            for rep in range(args.repeats):
                k = rep % len(engines)
                order = engines[k:] + engines[:k]  # rotate who runs first
                for engine in order:
                    r = run_one(engine, cfg_path, precision, args, envs)
                    r["repeat"] = rep
                    runs[engine].append(r)
                    raw.append(r)
                    print(f"[{name} {precision} repeat {rep + 1}/{args.repeats}] {engine}: "
                          f"{fmt_rate(r['throughput'])} {r['unit']}/s, median {r['median_ms']:.1f} ms/step, "
                          f"{r['minor_faults_per_step']:.0f} faults/step", file=sys.stderr, flush=True)
            rows.append((name, precision, runs))

    unit_of = lambda runs: "tok/s" if runs["athanor"][0]["unit"] == "tokens" else "samples/s"
    peak_of = {"f32": args.peak_f32, "bf16": args.peak_bf16}
    print(f"\n{args.repeats} repeats x {args.steps} timed steps (after {args.warmup} warm-up), {args.threads} threads; "
          f"{''.join(f'({n}: {steps_for(n, args)[0]} steps after {steps_for(n, args)[1]}) ' for n in args.configs if n in MIN_STEPS)}"
          f"median [min-max] over repeats; ratios paired per repeat."
          f"{' Emulating ' + args.emulate + ' (' + EMULATE[args.emulate][0] + ').' if args.emulate else ''}")
    for precision in args.precisions:
        given = peak_of[precision]
        sources = sorted({r.get("peak_source", "?") for _, p, runs in rows if p == precision for r in runs["athanor"]})
        print(f"MFU {precision}: against " + (f"{given} GFLOP/s (given)" if given else
              "the CPU's peak, as athanor derived it in each run: " + "; ".join(sources)))
    print()
    extra = " | athanor-env | athanor-env / tuned" if args.athanor_env else ""
    print("| config | prec | unit | athanor | torch default | torch tuned | athanor / default | athanor / tuned "
          f"| MFU athanor / tuned | faults/step athanor / tuned{extra} |")
    print("|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.athanor_env else ""))
    for name, precision, runs in rows:
        def cell(e):
            if not runs.get(e):
                return "not run"
            m, lo, hi = spread([r["throughput"] for r in runs[e]])
            return f"{fmt_rate(m)} [{fmt_rate(lo)}–{fmt_rate(hi)}]"
        def ratio(a, b):
            if not runs.get(a) or not runs.get(b):
                return "not run"
            m, lo, hi = spread([x["throughput"] / y["throughput"] for x, y in zip(runs[a], runs[b])])
            return f"{m:.2f}× [{lo:.2f}–{hi:.2f}]"
        peaks = [peak_of[precision] or r["peak_gflops"] for r in runs["athanor"]]
        mfu_a = statistics.median(r["achieved_gflops"] / p for r, p in zip(runs["athanor"], peaks))
        mfu_t = statistics.median(r["achieved_gflops"] / p for r, p in zip(runs["torch-tuned"], peaks))
        faults = (statistics.median(r["minor_faults_per_step"] for r in runs["athanor"]),
                  statistics.median(r["minor_faults_per_step"] for r in runs["torch-tuned"]))
        row = (f"| {name} | {precision} | {unit_of(runs)} | {cell('athanor')} | {cell('torch-default')} | {cell('torch-tuned')} "
               f"| {ratio('athanor', 'torch-default')} | {ratio('athanor', 'torch-tuned')} "
               f"| {100 * mfu_a:.1f}% / {100 * mfu_t:.1f}% | {faults[0]:.0f} / {faults[1]:.0f} |")
        if args.athanor_env:
            row += f" {cell('athanor-env')} | {ratio('athanor-env', 'torch-tuned')} |"
        print(row)
        faulting = [i for i, r in enumerate(runs["torch-tuned"]) if r["minor_faults_per_step"] > FAULTING]
        if faulting:
            clean = [i for i in range(len(runs["athanor"])) if i not in faulting]
            note = (f"  ({name} {precision}: tuned PyTorch still took >{FAULTING:,} page faults per step in repeat(s) "
                    f"{', '.join(str(i + 1) for i in faulting)}, not its steady state")
            if clean:
                m, lo, hi = spread([runs["athanor"][i]["throughput"] / runs["torch-tuned"][i]["throughput"] for i in clean])
                note += f"; athanor / tuned over the {len(clean)} clean repeat(s): {m:.2f}× [{lo:.2f}–{hi:.2f}]"
            print(note + ")")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
