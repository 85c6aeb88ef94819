"""The CPU f32 loss curve that the GPU's bf16 curve is held to (issue 22; tests/gpu/test_gpu_loss_curve.cpp).

    python3 tests/bench/loss_curve_fixture.py write ATHANOR_CLI    # 200 CPU f32 steps -> tests/gpu/test_gpu_loss_curve_cpu_f32.h
    python3 tests/bench/loss_curve_fixture.py check ATHANOR_CLI [N]   # the first N (default 3) steps again: the header is
                                                                    # still this build's CPU curve (label slow)

The run: bench/configs/gpt2-124m-gpu.yaml (GPT-2 124M, vocab 50304, the GPT-2 tokenizer on the Brown
corpus, AdamW, clip 1.0) at a batch the CPU side can afford: one sequence of 128 tokens per step,
200 steps, 20 warm-up steps then cosine decay to 0.1, f32 on the CPU. The GPU test runs the same
config under bf16 autocast on cuda and holds every logged step (every 10th) within 2% of this curve.
Why a committed curve rather than the CPU run inside the GPU test: the CPU side costs ~3.5-5 s a
step on this 2-core machine (bench/RESULTS.md, GPU section), minutes on the GPU machine's 16 cores,
past what one device call holds next to the other gpu tests; the CPU run is a function of the
config and seed (DESIGN.md "Determinism"), and `check` re-runs its first steps to catch a stale
header.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = "bench/configs/gpt2-124m-gpu.yaml"
HEADER = os.path.join(ROOT, "tests", "gpu", "test_gpu_loss_curve_cpu_f32.h")
STEPS = 200
# Both sides: everything but trainer.device and trainer.precision (the test adds those).
OVERRIDES = ["model.block_size=128", "trainer.batch_size=1", f"trainer.max_steps={STEPS}", "trainer.log_every=10",
             "trainer.eval_every=0", "trainer.eval_batches=1", "trainer.sample_every=0", "trainer.sample_tokens=0",
             "schedule.warmup_steps=20", "schedule.decay=cosine", "schedule.min_lr_ratio=0.1",
             "observe.report=false", "observe.tensorboard=false", "data.num_workers=1"]


def read_losses(path):
    losses = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):  # a complete row
                    r = json.loads(line)
                    if "loss" in r and "step" in r:
                        losses[r["step"]] = r["loss"]
    return losses


def run_cpu(cli, steps, out_dir):
    """The loss of steps 1..steps of the 200-step run (its schedule), stopping the run there."""
    cmd = [cli, "train", CONFIG, *OVERRIDES, "trainer.device=cpu", "trainer.precision=f32", "trainer.log_every=1",
           f"out_dir={out_dir}", "name=loss-curve"]
    metrics = os.path.join(out_dir, "loss-curve", "metrics.jsonl")
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        while p.poll() is None and len(read_losses(metrics)) < steps:
            time.sleep(0.5)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
    losses = read_losses(metrics)
    if len(losses) < steps:
        raise SystemExit(f"the CPU run ended (exit {p.returncode}) after {len(losses)} of {steps} steps")
    return [losses[s] for s in range(1, steps + 1)]


def write(cli):
    with tempfile.TemporaryDirectory() as d:
        losses = run_cpu(cli, STEPS, d)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    body = ",\n".join("    " + ", ".join(f"{v:.9g}" for v in losses[i:i + 8]) for i in range(0, STEPS, 8))
    with open(HEADER, "w") as f:
        f.write(f"""#pragma once
// Written by tests/bench/loss_curve_fixture.py (do not edit): the CPU f32 loss of every step of
// {CONFIG} with the overrides below, trainer.device=cpu, trainer.precision=f32
// (athanor at commit {commit}, this 2-core machine's portable build).
#include <array>

namespace athanor::gpu_test {{

inline constexpr const char* kLossCurveConfig = "{CONFIG}";
inline constexpr std::array<const char*, {len(OVERRIDES)}> kLossCurveOverrides = {{
{chr(10).join(f'    "{o}",' for o in OVERRIDES)}
}};
inline constexpr std::array<double, {STEPS}> kLossCurveCpuF32 = {{
{body}
}};

}}  // namespace athanor::gpu_test
""")
    print(f"wrote {HEADER}: steps 1..{STEPS}, loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def check(cli, n):
    text = open(HEADER).read()
    start = text.index("kLossCurveCpuF32 = {") + len("kLossCurveCpuF32 = {")
    want = [float(v) for v in text[start:text.index("};", start)].replace("\n", " ").split(",") if v.strip()]
    with tempfile.TemporaryDirectory() as d:
        got = run_cpu(cli, n, d)
    worst = max(abs(g - w) / abs(w) for g, w in zip(got, want))
    print(f"steps 1..{n}: header {want[:n]}, this build {got}; worst relative difference {worst:.2e}")
    # The same f32 run; only the reduction order of a different thread count may move the last bits.
    if worst > 1e-4:
        print("FAIL: the header is not this build's CPU curve: regenerate it (write)")
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("write", "check"):
        sys.exit(__doc__)
    cli = os.path.abspath(sys.argv[2])
    sys.exit(write(cli) if sys.argv[1] == "write" else check(cli, int(sys.argv[3]) if len(sys.argv) > 3 else 3))
