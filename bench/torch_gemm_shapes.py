#!/usr/bin/env python3
"""The GEMMs of bench/cuda_gemm.cpp (a GPT-2 training step's, each timed alone) as PyTorch runs
them, so that the GPU check holds our cuBLASLt path against torch's at the same shapes (issue 22).

    python3 bench/torch_gemm_shapes.py [--rows 16384] [--d 768] [--layers 12] [--vocab 50304]
                                       [--dtype bf16|f16] [--iters 10] [--max-seconds 20]
                                       [--device cuda|cpu]

The same names, shapes (m n k as bench_cuda_gemm prints them), per-step counts and in_step flags;
the calls are the ones eager PyTorch (and torch.compile's default mode, which leaves the matmuls
to cuBLAS) issues for nn.Linear under bf16 autocast, on operands already in the autocast dtype
(the weight's cast is a separate elementwise op, not timed):
  forward          F.linear(x, W, b)      (", no epilogue": F.linear(x, W))
  dx               g @ W
  dx (dgelu)       g @ W alone: torch runs the GELU's backward as a separate elementwise op
                   (timed on its own as "separate_ms", not added to "ms")
  dW               g^T @ x, written in the autocast dtype (the bf16 weight copy's gradient,
                   which autograd then adds into the f32 .grad: a separate op, not timed)
  dW (bias_grad)   g^T @ x, then db = g.sum(0): both kernels, the work our epilogue fuses (the
                   sum alone: "separate_ms")
Each is timed with CUDA events around each call after a warm-up: median, min and max over --iters
calls (3 calls each once --max-seconds have passed). TF32 is allowed as in the speed comparison
(bench/compare_pytorch_gpu.py). Prints one JSON line, keyed as bench_cuda_gemm's where the meaning
is the same, plus "engine": "torch", the torch and CUDA versions and the cuBLAS libraries loaded.
--device cpu is a dry run of the plumbing at small sizes: its timings mean nothing. Without torch,
or without a CUDA device for --device cuda, the line says why ("skipped") and the exit code is 3.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from torch_profile import loaded_libraries  # noqa: E402  (bench/torch_profile.py, packed beside this file)

USAGE_HINT = "see the usage at the top of bench/torch_gemm_shapes.py"


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16384, help="B x T, the rows of every activation")
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"], help="the autocast dtype")
    ap.add_argument("--iters", type=int, default=10, help="timed calls per GEMM")
    ap.add_argument("--max-seconds", type=float, default=20, help="past this (from the first GEMM), 3 timed calls per GEMM")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run (timings meaningless)")
    o = ap.parse_args(argv)
    if min(o.rows, o.d, o.layers, o.vocab, o.iters) <= 0:
        ap.error(f"sizes and --iters must be positive (got --rows {o.rows} --d {o.d} --layers {o.layers} "
                 f"--vocab {o.vocab} --iters {o.iters}); {USAGE_HINT}")
    if o.device not in ("cuda", "cpu") and not o.device.startswith("cuda:"):
        ap.error(f"--device {o.device}: give cuda, cuda:N or cpu")
    return o


# name, out, in, per_step, bias, dgelu: bench/cuda_gemm.cpp's `linears`, in its order.
def linears(o):
    D, L = o.d, o.layers
    return [("attn.c_attn", 3 * D, D, L, True, False), ("attn.c_proj", D, D, L, True, False),
            ("mlp.c_fc", 4 * D, D, L, True, False), ("mlp.c_proj", D, 4 * D, L, True, True),
            ("lm_head", o.vocab, D, 1, False, False)]


def gemm_table(o):
    """bench_cuda_gemm's GEMMs in its order: name, m n k, per_step, in_step (counted in the step's
    total), and the call that stands for it here (op: forward_bias, forward, dx, dx_dgelu, dw_db,
    dw) with its linear's out and in sizes. No torch needed."""
    M, rows = o.rows, []

    def row(name, m, n, k, per_step, in_step, op, out, inp):
        rows.append({"gemm": name, "m": m, "n": n, "k": k, "per_step": per_step, "in_step": in_step, "op": op,
                     "out": out, "in": inp})

    for name, out, inp, per_step, bias, dgelu in linears(o):
        row(f"{name} forward", M, out, inp, per_step, True, "forward_bias" if bias else "forward", out, inp)
        if bias:
            row(f"{name} forward, no epilogue", M, out, inp, per_step, False, "forward", out, inp)
        if dgelu:
            row(f"{name} dx (dgelu)", M, inp, out, per_step, True, "dx_dgelu", out, inp)
        row(f"{name} dx", M, inp, out, per_step, not dgelu, "dx", out, inp)
        if bias:
            row(f"{name} dW (bias_grad)", out, inp, M, per_step, True, "dw_db", out, inp)
        row(f"{name} dW", out, inp, M, per_step, not bias, "dw", out, inp)
    return rows


# What torch runs for each op (the "torch_op" of the output).
TORCH_OPS = {"forward_bias": "F.linear(x, W, b)", "forward": "F.linear(x, W)", "dx": "g @ W",
             "dx_dgelu": "g @ W alone: the GELU backward is a separate elementwise op in torch (separate_ms)",
             "dw_db": "g^T @ x, then db = g.sum(0) (two kernels)", "dw": "g^T @ x"}


def torch_calls(torch, o, row, t):
    """(the timed call, the separate op's call or None) of a gemm_table row, on the operand buffers
    t (x, g, w, b, y), each operand the buffer's first values as a contiguous matrix, as
    bench_cuda_gemm reads its buffers."""
    import torch.nn.functional as F

    def dense(buf, r, c):
        return buf.view(-1)[: r * c].view(r, c)

    M, out, inp = o.rows, row["out"], row["in"]
    x, g, w, b = dense(t["x"], M, inp), dense(t["g"], M, out), dense(t["w"], out, inp), t["b"][:out]
    op = row["op"]
    if op == "forward_bias":
        return (lambda: F.linear(x, w, b)), None
    if op == "forward":
        return (lambda: F.linear(x, w)), None
    if op in ("dx", "dx_dgelu"):
        # dx_dgelu: the pre-GELU activations are x (bench_cuda_gemm's aux is its x buffer too)
        sep = (lambda d=dense(t["y"], M, inp): torch.ops.aten.gelu_backward(d, x, approximate="tanh")) if op == "dx_dgelu" else None
        return (lambda: torch.mm(g, w)), sep
    if op == "dw_db":
        def dw_db():
            torch.mm(g.t(), x)
            return g.sum(0)
        return dw_db, (lambda: g.sum(0))
    return (lambda: torch.mm(g.t(), x)), None


class Timer:
    """ms per call: a warm-up call, then each of `iters` calls between its own two events (the
    wall clock on the CPU); median, min, max. Past `max_seconds` since the start: 3 calls."""

    def __init__(self, torch, device, iters, max_seconds):
        self.torch, self.cuda, self.iters, self.max_seconds = torch, device.startswith("cuda"), iters, max_seconds
        self.start = time.monotonic()
        self.truncated = False

    def ms(self, fn):
        torch = self.torch
        fn()
        n = self.iters
        if time.monotonic() - self.start > self.max_seconds:
            n, self.truncated = min(n, 3), True
        if self.cuda:
            torch.cuda.synchronize()
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            for e0, e1 in ev:
                e0.record()
                fn()
                e1.record()
            torch.cuda.synchronize()
            times = [e0.elapsed_time(e1) for e0, e1 in ev]
        else:
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), min(times), max(times), n


def run(o):
    import torch

    cuda = o.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        return {"skipped": f"--device {o.device} but torch {torch.__version__} sees no CUDA device (--device cpu: a dry run)"}
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # as bench/compare_pytorch_gpu.py's torch.compile runs
        torch.backends.cudnn.allow_tf32 = True
    dt = torch.bfloat16 if o.dtype == "bf16" else torch.float16
    outs = [l[1] for l in linears(o)]
    ins = [l[2] for l in linears(o)]
    max_out, max_in = max(outs), max(ins)
    gen = torch.Generator(device=o.device).manual_seed(1)

    def rand(*shape):  # uniform [-1, 1) as bench_cuda_gemm's fill_random (zeros would flatter), made on the device
        return (torch.rand(*shape, generator=gen, device=o.device) * 2 - 1).to(dt)

    t = {"x": rand(o.rows, max_in), "g": rand(o.rows, max_out), "w": rand(max_out, max_in), "b": rand(max_out),
         "y": rand(o.rows, max_in)}
    timer = Timer(torch, o.device, o.iters, o.max_seconds)
    gemms, step_ms, step_flop = [], 0.0, 0.0
    for spec in gemm_table(o):
        fn, separate = torch_calls(torch, o, spec, t)
        row = {k: spec[k] for k in ("gemm", "m", "n", "k", "per_step", "in_step")}
        row["torch_op"] = TORCH_OPS[spec["op"]]
        m, n, k, per_step, in_step = row["m"], row["n"], row["k"], row["per_step"], row["in_step"]
        try:
            med, lo, hi, calls = timer.ms(fn)
            row.update(ms=round(med, 4), min_ms=round(lo, 4), max_ms=round(hi, 4), iters=calls)
            if separate is not None:
                row["separate_ms"] = round(timer.ms(separate)[0], 4)
        except RuntimeError as e:  # reported, as bench_cuda_gemm reports a declined GEMM (-1)
            row.update(ms=-1, error=str(e).splitlines()[0][:300])
        flop = 2.0 * m * n * k
        row["tflops"] = round(flop / (row["ms"] * 1e-3) / 1e12, 1) if row["ms"] > 0 else 0.0
        gemms.append(row)
        if in_step and row["ms"] > 0:
            step_ms += row["ms"] * per_step
            step_flop += flop * per_step
    out = {"bench": "torch_gemm_shapes", "engine": "torch", "device": o.device,
           "gpu": torch.cuda.get_device_name(torch.device(o.device)) if cuda else "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda, "dtype": o.dtype, "rows": o.rows, "d": o.d,
           "layers": o.layers, "vocab": o.vocab, "allow_tf32": bool(cuda and torch.backends.cuda.matmul.allow_tf32),
           "dw_out_dtype": o.dtype, "timing": "CUDA events per call" if cuda else "wall clock per call",
           "step_gemm_ms": round(step_ms, 3), "step_gemm_tflops": round(step_flop / (step_ms * 1e-3) / 1e12, 1) if step_ms > 0 else 0.0,
           "truncated_by_max_seconds": timer.truncated, "libraries": loaded_libraries(("libcublas",)), "gemms": gemms}
    if not cuda:
        out["dry_run"] = "--device cpu: a check of the plumbing at small sizes; the timings mean nothing"
    return out


SKIPPED_EXIT = 3  # no torch, or no CUDA device for --device cuda: the JSON line says which ("skipped")


def main(argv=None):
    o = parse(sys.argv[1:] if argv is None else argv)
    try:
        import torch  # noqa: F401
        out = run(o)
    except ImportError as e:
        out = {"skipped": f"{sys.executable} cannot import torch ({e})"}
    if "skipped" in out:
        out.update(bench="torch_gemm_shapes", engine="torch")
        print(f"torch_gemm_shapes: skipped: {out['skipped']}", file=sys.stderr)
    print(json.dumps(out), flush=True)
    return SKIPPED_EXIT if "skipped" in out else 0


if __name__ == "__main__":
    sys.exit(main())
