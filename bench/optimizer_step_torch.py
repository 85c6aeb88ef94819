"""PyTorch twin of bench/optimizer_step.cpp: torch.optim.SGD(momentum=0.9) / AdamW
with foreach=True on the same parameter shapes (MLP 784-1024-1024-10, GPT-2 124M),
plus torch.nn.utils.clip_grad_norm_ (the norm and scale passes). Median / p10 / p90
in ms over REPS.

  OMP_NUM_THREADS=2 /usr/bin/python3 bench/optimizer_step_torch.py mlp sgd 200
  OMP_NUM_THREADS=2 /usr/bin/python3 bench/optimizer_step_torch.py gpt2 adamw 20
"""
import os
import sys
import time

import torch


def shapes(model):
    if model == "mlp":
        return [(1024, 784), (1024,), (1024, 1024), (1024,), (10, 1024), (10,)]
    c = 768
    s = [(50257, c), (1024, c)]
    for _ in range(12):
        s += [(c,), (c,), (3 * c, c), (3 * c,), (c, c), (c,), (c,), (c,), (4 * c, c), (4 * c,), (c, 4 * c), (c,)]
    return s + [(c,), (c,)]


def stats(t):
    t = sorted(t)
    at = lambda q: t[int(q * (len(t) - 1))]
    return at(0.5), at(0.1), at(0.9)


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else "mlp"
    opt = sys.argv[2] if len(sys.argv) > 2 else "sgd"
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    g = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(s, generator=g) * 0.02) for s in shapes(model)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    if opt == "adamw":
        o = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                              lr=3e-4, foreach=True)
    else:
        o = torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=True)
    n = sum(p.numel() for p in params)
    nbytes = n * 4.0 * (3 + 2 * (2 if opt == "adamw" else 1))
    for _ in range(3):
        o.step()
    t_step, t_clip = [], []
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            o.step()
            t1 = time.perf_counter()
            norm = torch.nn.utils.clip_grad_norm_(params, 1e9)  # the norm pass only (no scaling)
            t2 = time.perf_counter()
            t_step.append((t1 - t0) * 1e3)
            t_clip.append((t2 - t1) * 1e3)
    print(f"torch {torch.__version__} {model} {opt} foreach, {n} parameters in {len(params)} tensors, {reps} reps, "
          f"{torch.get_num_threads()} threads")
    m, p10, p90 = stats(t_step)
    print(f"step       median {m:8.3f} ms  p10 {p10:8.3f}  p90 {p90:8.3f}  {nbytes / p10 * 1e-6:6.1f} GB/s at p10")
    m, p10, p90 = stats(t_clip)
    print(f"grad_norm  median {m:8.3f} ms  p10 {p10:8.3f}  p90 {p90:8.3f}  {4.0 * n / p10 * 1e-6:6.1f} GB/s at p10")


if __name__ == "__main__":
    main()
