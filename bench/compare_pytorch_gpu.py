#!/usr/bin/env python3
"""athanor against PyTorch's torch.compile on one GPU, same model, batch and optimizer, in
one invocation (issue 22).

    python3 bench/compare_pytorch_gpu.py                                  # on the GPU machine: 124M and 350M
    python3 bench/compare_pytorch_gpu.py --configs gpt2-124m-gpu --repeats 3 --out gpu_bench.json
    python3 bench/compare_pytorch_gpu.py --table gpu_bench.json           # the Markdown table of a saved --out
    /usr/bin/python3 bench/compare_pytorch_gpu.py --device cpu --tiny     # here: the CPU smoke path (torch 1.13, eager)

The reference is PyTorch as its users run it for speed: torch.compile (default mode, whole
model, static shapes), bf16 autocast, F.scaled_dot_product_attention restricted to the flash
backend, fused AdamW, TF32 matmuls allowed. The model is athanor's nn::GPT: token + position
embedding, pre-LN blocks (LayerNorm -> causal self-attention -> residual; LayerNorm -> Linear 4d
-> GELU(tanh) -> Linear d -> residual), final LayerNorm, lm_head tied to the token embedding,
cross-entropy in f32 over the (padded) vocabulary; GPT-2's init (N(0, 0.02), the residual
projections' N(0, 0.02/sqrt(2L)), zero biases); AdamW without weight decay on biases, norms
and embeddings; grad clip by global norm. The gpt2-*-ckpt configs (model.gradient_checkpointing)
run each block under torch.utils.checkpoint (non-reentrant). Random token ids are made on the
device before timing (athanor's loader prefetches on worker threads: neither side times data).

Per config:
 1. one PyTorch worker process builds the model and its AdamW state and holds them (what it
    holds while athanor runs: its weights, optimizer state and CUDA context, its cache emptied);
 2. the micro-batch: beside that, athanor tries --batches (64, 32, 16) largest first (`athanor
    bench` of one step), then PyTorch from athanor's largest down with one eager step (eager
    holds at least the compiled graph's activations); both engines run at the largest both fit;
    the worker then compiles and warms up (the compile time is reported, never timed, and counts
    against the caller's budget: --budget-s);
 3. --repeats paired repeats, the order rotating between them: each engine times --steps steps
    after --warmup warm-up steps (athanor: `athanor bench CONFIG trainer.batch_size=B --json`,
    a fresh process each repeat; PyTorch: the same worker), each step ended by a device sync;
 4. per engine: tokens/s at the median step (median [min–max] over repeats), ms/step, MFU
    against --peak-tflops (989: H100 SXM dense bf16; DESIGN.md "Honest metrics") with one FLOP
    count for both (6 N + 12 L d T per token, N without wpe), and the peak device memory over
    the timed steps (torch.cuda.max_memory_allocated after a reset; athanor's caching allocator
    peak, reset after its warm-up); the ratio athanor ÷ torch.compile paired per repeat.
Prints a Markdown table for bench/RESULTS.md (the device named on every row); --out FILE keeps
every raw result. --torch-profile-steps N (off by default; --torch-profile-configs picks the
configs) then runs N more compiled steps of the worker under torch.profiler, after the timed
repeats, and reports torch.compile's device time per step by kernel category and its top 15
kernels (bench/torch_profile.py), in the config's record ("torch_profile") and as short tables
after the main one. The GPU machine's Python has torch and numpy but no PyYAML: the configs are
read by a small reader of the two-level YAML in bench/configs (PyYAML when present).
"""
import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:  # bench/torch_profile.py beside this file (also when loaded by path, as the tests do)
    sys.path.insert(0, HERE)
import torch_profile  # noqa: E402
DEFAULT_CONFIGS = ["gpt2-124m-gpu", "gpt2-350m-gpu"]
# --torch-profile-steps starts only with this much of --budget-s left (a few steps under the
# profiler and the reading of its records).
PROFILE_MIN_BUDGET_S = 30
H100_BF16_TFLOPS = 989.0
# --tiny: a model small enough for two CPU steps in a unit test (byte tokenizer: no BPE shards
# needed), f32, on the CPU, eager (torch 1.13 has no torch.compile).
TINY = ["model.n_layer=2", "model.n_head=2", "model.n_embd=64", "model.block_size=32", "model.vocab_size=512",
        "data.tokenizer=byte", "trainer.precision=f32", "trainer.device=cpu", "data.num_workers=0"]


# ---- configs ------------------------------------------------------------------------------

def _scalar(v):
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return v[1:-1]
    if v.startswith("[") and v.endswith("]"):  # a flow list of scalars: [784, 256, 10]
        return [_scalar(x) for x in v[1:-1].split(",") if x.strip()]
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def parse_yaml(text, path="<config>"):
    """The two-level mappings of bench/configs (section: / two-space key: scalar)."""
    try:
        import yaml  # noqa: F401  (the full parser where this Python has it)
        return yaml.safe_load(text) or {}
    except ImportError:
        pass
    out, section = {}, None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        if not sep:
            raise SystemExit(f"{path}:{n}: expected 'key: value', got {raw!r}")
        if indent == 0:
            if value.strip():
                out[key] = _scalar(value)
                section = None
            else:
                section = out.setdefault(key, {})
        elif section is not None:
            section[key] = _scalar(value)
        else:
            raise SystemExit(f"{path}:{n}: indented key {key!r} outside a section")
    return out


def load_config(path, overrides=()):
    with open(path) as f:
        cfg = parse_yaml(f.read(), path)
    for o in overrides:
        key, sep, value = o.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"override {o!r}: expected section.key=value")
        section, name = key.split(".", 1)
        cfg.setdefault(section, {})[name] = _scalar(value)
    return cfg


# ---- the PyTorch model (athanor's nn::GPT) -------------------------------------------------

def build_torch(cfg, device, use_sdpa):
    """The model and its AdamW; make_data() makes a batch's token ids."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    m, o = cfg["model"], cfg["optimizer"]
    if m.get("type", "gpt") != "gpt":
        raise SystemExit(f"compare_pytorch_gpu.py mirrors the GPT only (model.type {m.get('type')})")
    L, d, h, T, V = (int(m["n_layer"]), int(m["n_embd"]), int(m["n_head"]), int(m["block_size"]), int(m["vocab_size"]))
    bias = bool(m.get("bias", True))
    if not bias:  # torch 1.13's LayerNorm has no bias switch; the bench configs keep GPT-2's biases
        raise SystemExit("compare_pytorch_gpu.py mirrors model.bias: true only")
    ckpt = bool(m.get("gradient_checkpointing", False))
    if float(m.get("dropout", 0.0)) != 0.0:
        raise SystemExit("compare_pytorch_gpu.py times dropout-free models (model.dropout: 0)")

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(d, 3 * d, bias=bias)
            self.c_proj = nn.Linear(d, d, bias=bias)

        def forward(self, x):
            B, T_, C = x.shape
            q, k, v = (t.view(B, T_, h, C // h).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
            if use_sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # torch 1.13 (the CPU smoke path): written out
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // h))
                mask = torch.ones(T_, T_, dtype=torch.bool, device=x.device).tril()
                y = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T_, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(d)
            self.c_fc = nn.Linear(d, 4 * d, bias=bias)
            self.c_proj = nn.Linear(4 * d, d, bias=bias)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, d)
            self.wpe = nn.Embedding(T, d)
            self.h = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(d)
            for n, p in self.named_parameters():  # athanor's GPT init (src/nn/gpt.cpp)
                if ".ln_" in n or n.startswith("ln_f"):
                    continue
                if p.dim() >= 2:
                    nn.init.normal_(p, std=0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") else 0.02)
                else:
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.h:
                if ckpt and self.training:
                    from torch.utils.checkpoint import checkpoint
                    x = checkpoint(b, x, use_reentrant=False)
                else:
                    x = b(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied lm_head
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    torch.manual_seed(int(cfg.get("seed", 0)))
    model = GPT().to(device)
    named = list(model.named_parameters())
    nodecay = lambda n, p: p.dim() < 2 or n.startswith("wte") or n.startswith("wpe")  # athanor's rule
    groups = [{"params": [p for n, p in named if not nodecay(n, p)], "weight_decay": float(o.get("weight_decay", 0.0))},
              {"params": [p for n, p in named if nodecay(n, p)], "weight_decay": 0.0}]
    kw = {"fused": True} if device.startswith("cuda") else {}
    opt = torch.optim.AdamW(groups, lr=float(o.get("lr", 1e-3)), betas=(float(o.get("beta1", 0.9)), float(o.get("beta2", 0.999))),
                            eps=float(o.get("eps", 1e-8)), **kw)
    n_flop = sum(p.numel() for n, p in named if not n.startswith("wpe"))
    flops_per_token = 6.0 * n_flop + 12.0 * L * d * T  # as athanor's training_flops_per_step
    return model, opt, flops_per_token, float(o.get("grad_clip", 0.0)), sum(p.numel() for _, p in named)


def make_data(torch, cfg, device, batch):
    """4 batches of random token ids and targets, on the device (made before any timing)."""
    T, V = int(cfg["model"]["block_size"]), int(cfg["model"]["vocab_size"])
    g = torch.Generator(device="cpu").manual_seed(int(cfg.get("seed", 0)))
    return [(torch.randint(0, V, (batch, T), generator=g).to(device), torch.randint(0, V, (batch, T), generator=g).to(device))
            for _ in range(4)]


# ---- the PyTorch worker (a subprocess: it holds the GPU between its repeats) --------------

def emit(obj):
    print(json.dumps(obj), flush=True)


def torch_worker(args):
    import torch

    cuda = args.device.startswith("cuda")
    cfg = load_config(args.config, args.set)
    precision = cfg.get("trainer", {}).get("precision", "f32")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        # SDPA's flash kernel only: an error rather than a silent fallback to another backend.
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_math_sdp(False)
        if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            torch.backends.cuda.enable_cudnn_sdp(False)
    use_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    if cuda and not use_sdpa:
        raise SystemExit(f"torch {torch.__version__} has no F.scaled_dot_product_attention")
    compile_ok = cuda and hasattr(torch, "compile") and not args.no_compile
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def oom(e):  # torch.cuda.OutOfMemoryError is a RuntimeError
        return isinstance(e, RuntimeError) and "out of memory" in str(e)

    # The unit test's stand-in for a GPU's limit (tests/bench): an out-of-memory above this batch.
    fake_limit = int(os.environ.get("COMPARE_GPU_TEST_OOM_ABOVE", "0"))

    # 0. resident: the model, its AdamW state (one eager step of batch 1 makes it) and the CUDA
    # context, what this process holds while athanor runs; athanor's batch probe runs beside it.
    model, opt, flops_per_token, clip, nparams = build_torch(cfg, args.device, use_sdpa)
    eager = make_step(torch, model, model, opt, clip, precision, cuda)
    eager(make_data(torch, cfg, args.device, 1)[0])
    sync()
    if cuda:
        torch.cuda.empty_cache()
    emit({"event": "resident", "bytes": torch.cuda.memory_allocated() if cuda else 0})
    line = sys.stdin.readline().split()
    if not line or line[0] != "probe":
        return 0
    candidates = [int(b) for b in line[1:]]

    # 1. the batch: one eager step at each candidate, largest first (eager holds at least the
    # compiled graph's activations).
    batch, data = None, None
    for b in candidates:
        failed = None
        try:
            if fake_limit and b > fake_limit:
                raise RuntimeError(f"out of memory (simulated above batch {fake_limit}: COMPARE_GPU_TEST_OOM_ABOVE)")
            data = make_data(torch, cfg, args.device, b)
            eager(data[0])
            sync()
            batch = b
        except Exception as e:  # noqa: BLE001 (an OOM is any of torch's error classes across versions)
            if not oom(e):
                raise
            failed = str(e).splitlines()[0][:300]
        if batch is not None:
            break
        # Outside the except block: its traceback holds the failed step's tensors until it ends.
        data = None
        opt.zero_grad(set_to_none=True)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        emit({"event": "probe", "batch": b, "fits": False, "error": failed})
    if batch is None:
        emit({"event": "error", "error": f"no batch of {candidates} fits"})
        return 1
    emit({"event": "probe", "batch": batch, "fits": True})
    flops = flops_per_token * batch * int(cfg["model"]["block_size"])

    # 2. compile and warm up: never timed, reported.
    t0 = time.perf_counter()
    runner = torch.compile(model, dynamic=False) if compile_ok else model
    step_fn = make_step(torch, model, runner, opt, clip, precision, cuda)
    first = []
    for i in range(args.warmup):
        s0 = time.perf_counter()
        step_fn(data[i % len(data)])
        sync()
        first.append(time.perf_counter() - s0)
    warm_s = time.perf_counter() - t0
    emit({"event": "ready", "batch": batch, "compiled": compile_ok, "warmup_s": warm_s,
          "compile_s": max(0.0, warm_s - len(first) * (min(first) if first else 0.0)), "torch": torch.__version__})

    # 3. one timed repeat per "run" line on stdin, the cache emptied between them (athanor runs then);
    # "profile N": N more steps under torch.profiler (after the timed repeats, never timed).
    k = 0
    for line in sys.stdin:
        cmd = line.split()
        if len(cmd) == 2 and cmd[0] == "profile":
            emit(profile_steps(torch, step_fn, data, k, int(cmd[1]), cuda, sync, batch))
            k += int(cmd[1])
            continue
        if cmd != ["run"]:
            break
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times, loss = [], None
        for i in range(args.steps):
            s0 = time.perf_counter()
            loss = step_fn(data[k % len(data)])
            sync()
            times.append(time.perf_counter() - s0)
            k += 1
        peak = torch.cuda.max_memory_allocated() if cuda else 0
        reserved = torch.cuda.max_memory_reserved() if cuda else 0
        if cuda:
            torch.cuda.empty_cache()  # give athanor the memory; weights, grads-as-None and states stay
        emit(result_record("torch.compile" if compile_ok else "torch-eager", cfg, batch, times, flops, nparams,
                           float(loss), peak, reserved, args.device, precision,
                           torch.cuda.get_device_name() if cuda else "cpu", torch.__version__))
    return 0


def profile_steps(torch, step_fn, data, k, n, cuda, sync, batch):
    """The "profile" event: n steps under torch.profiler (CPU and, on a GPU, CUDA activity), each
    ended by a device sync; the device time per step by kernel category and the top kernels
    (torch_profile.summarize), the wall time per profiled step (the profiler's overhead in it), the
    cuBLAS/cuDNN libraries this process loaded. A failure is reported in the event, not raised:
    the profile is a diagnostic beside the comparison."""
    t0 = time.perf_counter()
    try:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        walls = []
        with profile(activities=acts) as prof:
            for i in range(n):
                s0 = time.perf_counter()
                step_fn(data[(k + i) % len(data)])
                sync()
                walls.append((time.perf_counter() - s0) * 1e3)
        records = torch_profile.device_records(prof, cuda)
        if cuda and not records:
            raise RuntimeError("the profiler recorded no CUDA activity (is CUPTI loadable?)")
        out = torch_profile.summarize(records, n)
        out.update(step_ms=statistics.median(walls), batch=batch,
                   device=torch.cuda.get_device_name() if cuda else "cpu (dry run: the categories are of aten ops' CPU time)",
                   libraries=torch_profile.loaded_libraries())
    except Exception as e:  # noqa: BLE001 (any failure of the profiler is reported, the worker goes on)
        out = {"steps": n, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    out.update(event="profile", wall_s=time.perf_counter() - t0)
    return out


def make_step(torch, model, runner, opt, clip, precision, cuda):
    params = [p for p in model.parameters()]
    dev_type = "cuda" if cuda else "cpu"
    lowp = precision == "bf16"

    def step(batch):
        x, y = batch
        if lowp:
            with torch.autocast(dev_type, dtype=torch.bfloat16):
                loss = runner(x, y)
        else:
            loss = runner(x, y)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def result_record(engine, cfg, batch, times, flops, nparams, loss, peak, reserved, device, precision, device_name, version):
    s = sorted(times)
    med = statistics.median(s)
    T = int(cfg["model"]["block_size"])
    return {"event": "result", "engine": engine, "name": cfg.get("name", ""), "precision": precision, "batch": batch,
            "targets_per_step": batch * T, "parameters": nparams, "steps": len(times),
            "step_ms": [t * 1e3 for t in times], "min_ms": s[0] * 1e3, "median_ms": med * 1e3, "max_ms": s[-1] * 1e3,
            "throughput": batch * T / med, "flops_per_step": flops, "achieved_gflops": flops / med * 1e-9,
            "final_loss": loss, "peak_bytes": {"total": peak}, "reserved_bytes": reserved, "device": device,
            "device_name": device_name, "torch": version}


# ---- the driver ------------------------------------------------------------------------------

class Budget:
    def __init__(self, seconds):
        self.t0, self.seconds = time.time(), seconds

    def left(self):
        return self.seconds - (time.time() - self.t0) if self.seconds > 0 else float("inf")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_athanor(args, cfg_path, overrides, batch, steps, warmup, timeout):
    cmd = [args.athanor, "bench", cfg_path, *overrides, f"trainer.batch_size={batch}", "--json",
           "--steps", str(steps), "--warmup", str(warmup)]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=args.cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "cmd": " ".join(cmd)}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        err = (p.stderr.strip() or p.stdout.strip())[-1500:]
        return {"error": err or f"exit {p.returncode}", "oom": "out of memory" in err.lower(), "cmd": " ".join(cmd)}
    r = json.loads(lines[-1])
    r["wall_s"] = time.time() - t0
    r["batch"] = batch
    return r


def athanor_batch(args, cfg_path, overrides, budget):
    """The largest of --batches whose `athanor bench` step runs (an OOM moves to the next)."""
    tried = []
    for b in args.batches:
        r = run_athanor(args, cfg_path, overrides, b, 1, 0, min(args.timeout, max(budget.left(), 1)))
        if "error" not in r:
            return b, tried
        tried.append({"batch": b, "error": r["error"][-400:]})
        if not r.get("oom"):
            return None, tried
    return None, tried


def compare_config(args, name, budget, rec, save=lambda: None):
    """Fills `rec` (already in the results), calling save() after each repeat."""
    cfg_path = os.path.join(ROOT, "bench", "configs", name + ".yaml") if not name.endswith(".yaml") else name
    if not os.path.exists(cfg_path):
        raise SystemExit(f"no config {cfg_path}")
    overrides = list(args.set) + (TINY if args.tiny else []) + [f"trainer.device={args.device}"]
    m = load_config(cfg_path, overrides)["model"]  # read here too: a bad file fails before any engine starts
    rec.update({"config": name, "device": args.device, "overrides": overrides, "repeats": [],
                "model": {k: m.get(k) for k in ("n_layer", "n_embd", "n_head", "block_size", "vocab_size", "gradient_checkpointing")}})
    t_cfg = time.time()

    worker_cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--config", cfg_path, "--device", args.device,
                  "--steps", str(args.steps), "--warmup", str(args.warmup)]
    for o in overrides:
        worker_cmd += ["--set", o]
    if args.no_compile:
        worker_cmd.append("--no-compile")
    w = subprocess.Popen(worker_cmd, cwd=args.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def read_event(want):
        for line in w.stdout:
            if not line.startswith("{"):
                continue
            ev = json.loads(line)
            if ev.get("event") == "probe" and want != "probe":
                rec.setdefault("torch_probe", []).append(ev)
                continue
            if ev.get("event") in (want, "error"):
                return ev
        return {"event": "error", "error": f"the PyTorch worker exited (code {w.wait()})"}

    try:
        # PyTorch's resident weights and optimizer state first, so that athanor's batch probe
        # sees the memory its timed runs will see (they run beside them).
        resident = read_event("resident")
        if resident.get("event") != "resident":
            rec["error"] = "torch: " + resident["error"]
            return rec
        rec["torch_resident_bytes"] = resident["bytes"]
        b_a, tried = athanor_batch(args, cfg_path, overrides, budget)
        rec["athanor_probe"] = tried
        if b_a is None:
            rec["error"] = "athanor: no batch fits" + (f" (last: {tried[-1]['error'][-300:]})" if tried else "")
            return rec
        log(f"[{name}] athanor fits batch {b_a} (beside PyTorch's resident {resident['bytes'] / 2**30:.1f} GiB)")
        w.stdin.write("probe " + " ".join(str(b) for b in args.batches if b <= b_a) + "\n")
        w.stdin.flush()
        ready = read_event("ready")
        if ready.get("event") != "ready":
            rec["error"] = "torch: " + ready["error"]
            return rec
        rec.update(batch=ready["batch"], torch_compile_s=ready["compile_s"], torch_warmup_s=ready["warmup_s"],
                   torch_compiled=ready["compiled"], torch_version=ready["torch"])
        log(f"[{name}] torch {ready['torch']} fits batch {ready['batch']}; compile + {args.warmup} warm-up steps "
            f"{ready['warmup_s']:.1f} s (compile ~{ready['compile_s']:.1f} s)")
        B = ready["batch"]
        for rep in range(args.repeats):
            # Stop before a repeat the budget cannot hold (the first repeat's cost, or a guess).
            per_rep = rec.get("rep_s", 0.0)
            if rep > 0 and budget.left() < 1.2 * per_rep:
                rec["stopped"] = f"budget: {budget.left():.0f} s left, a repeat takes ~{per_rep:.0f} s"
                break
            r0 = time.time()
            pair = {}
            for engine in (["torch", "athanor"] if rep % 2 == 0 else ["athanor", "torch"]):
                if engine == "torch":
                    w.stdin.write("run\n")
                    w.stdin.flush()
                    ev = read_event("result")
                    if ev.get("event") != "result":
                        rec["error"] = "torch: " + ev["error"]
                        return rec
                    pair["torch"] = ev
                else:
                    r = run_athanor(args, cfg_path, overrides, B, args.steps, args.warmup, args.timeout)
                    if "error" in r:
                        rec["error"] = "athanor: " + r["error"][-600:]
                        return rec
                    pair["athanor"] = r
            rec["repeats"].append(pair)
            rec["rep_s"] = time.time() - r0
            save()  # a run killed later (the caller's hard timeout) keeps this repeat
            a, t = pair["athanor"], pair["torch"]
            log(f"[{name} B={B} repeat {rep + 1}/{args.repeats}] athanor {a['throughput']:,.0f} tok/s "
                f"({a['median_ms']:.1f} ms/step), {t['engine']} {t['throughput']:,.0f} tok/s ({t['median_ms']:.1f} ms/step): "
                f"{a['throughput'] / t['throughput']:.3f}x")
        if args.torch_profile_steps > 0 and (args.torch_profile_configs is None or name in args.torch_profile_configs):
            # After the timed repeats, so that it cannot disturb them; skipped when the budget is spent.
            if rec.get("stopped") or budget.left() < PROFILE_MIN_BUDGET_S:
                rec["torch_profile"] = {"skipped": f"budget: {budget.left():.0f} s left"}
            else:
                w.stdin.write(f"profile {args.torch_profile_steps}\n")
                w.stdin.flush()
                ev = read_event("profile")
                rec["torch_profile"] = {k: v for k, v in ev.items() if k != "event"}
                prof = rec["torch_profile"]
                if "error" in prof:
                    log(f"[{name}] torch profile failed: {prof['error']}")
                else:
                    log(f"[{name}] torch profile: {prof['device_ms_per_step']:.1f} ms of device time per step ("
                        + ", ".join(f"{c} {v['ms_per_step']:.1f}" for c, v in prof["categories"].items() if v["ms_per_step"] > 0)
                        + f"); {prof['wall_s']:.1f} s")
            save()
    finally:
        try:
            w.stdin.write("quit\n")
            w.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass
        try:
            w.wait(timeout=30)
        except subprocess.TimeoutExpired:
            w.kill()
        rec["wall_s"] = time.time() - t_cfg
    return rec


# ---- the table ------------------------------------------------------------------------------

def spread(values):
    return statistics.median(values), min(values), max(values)


def gib(b):
    return f"{b / 2**30:.1f}"


def summarize(rec, peak_tflops):
    """Per engine: throughput median [min-max], ms/step, MFU, peak memory; the paired ratio."""
    reps = rec.get("repeats", [])
    if not reps:
        return None
    out = {}
    for engine in ("athanor", "torch"):
        rs = [p[engine] for p in reps]
        tput = [r["throughput"] for r in rs]
        out[engine] = {
            "throughput": spread(tput),
            "median_ms": spread([r["median_ms"] for r in rs]),
            "mfu": statistics.median(r["flops_per_step"] / (r["median_ms"] * 1e-3) / (peak_tflops * 1e12) for r in rs),
            "peak_bytes": max(r["peak_bytes"]["total"] for r in rs),
        }
    out["ratio"] = spread([p["athanor"]["throughput"] / p["torch"]["throughput"] for p in reps])
    out["same_model"] = all(abs(p["athanor"]["flops_per_step"] - p["torch"]["flops_per_step"]) <= 1e-6 * p["torch"]["flops_per_step"]
                            and p["athanor"]["parameters"] == p["torch"]["parameters"] for p in reps)
    return out


def table(results, peak_tflops=H100_BF16_TFLOPS):
    device = results.get("device_name") or results.get("device", "?")
    lines = [f"Device: {device}. {results.get('steps', '?')} timed steps after {results.get('warmup', '?')} warm-up per "
             f"repeat, {results.get('repeats', '?')} paired repeats; median [min–max] over repeats; MFU against "
             f"{peak_tflops:g} TFLOP/s; peak = device memory allocated over the timed steps.", "",
             "| config | device | batch × T | PyTorch | athanor tok/s | PyTorch tok/s | athanor ÷ PyTorch | ms/step athanor / PyTorch "
             "| MFU athanor / PyTorch | peak GiB athanor / PyTorch | PyTorch compile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for rec in results["configs"]:
        s = summarize(rec, peak_tflops)
        if s is None:
            lines.append(f"| {rec['config']} | {device} | — | not measured: {rec.get('error', rec.get('stopped', 'no repeat ran'))} "
                         "| | | | | | | |")
            continue
        T = rec["repeats"][0]["athanor"]["targets_per_step"] // rec["batch"]
        a, t = s["athanor"], s["torch"]
        r = s["ratio"]
        note = "" if s["same_model"] else " (the engines' models differ: parameters or FLOPs!)"
        torch_mode = f"{rec.get('torch_version', '?')} {'torch.compile' if rec.get('torch_compiled') else 'eager'}"
        lines.append(
            f"| {rec['config']}{note} | {device} | {rec['batch']} × {T} | {torch_mode} | {fmt_spread_t(a['throughput'])} "
            f"| {fmt_spread_t(t['throughput'])} "
            f"| {r[0]:.2f}× [{r[1]:.2f}–{r[2]:.2f}] | {a['median_ms'][0]:.1f} / {t['median_ms'][0]:.1f} "
            f"| {100 * a['mfu']:.1f}% / {100 * t['mfu']:.1f}% | {gib(a['peak_bytes'])} / {gib(t['peak_bytes'])} "
            f"| {rec.get('torch_compile_s', 0):.0f} |")
        for why in ("stopped", "error"):  # repeats that ran before the budget or a failure ended the config
            if rec.get(why):
                lines.append(f"  ({rec['config']}, {why}: {rec[why]})")
    for rec in results["configs"]:  # torch.compile's step by kernel category (--torch-profile-steps)
        prof = rec.get("torch_profile")
        if not prof:
            continue
        engine = "torch.compile" if rec.get("torch_compiled") else "PyTorch eager"
        lines.append("")
        if "categories" in prof:
            lines += torch_profile.markdown(rec["config"], prof, engine)
        else:
            lines.append(f"{engine}'s step on the device, {rec['config']}: not profiled "
                         f"({prof.get('error') or prof.get('skipped') or 'no record'})")
    return "\n".join(lines)


def fmt_spread_t(t):
    return f"{t[0]:,.0f} [{t[1]:,.0f}–{t[2]:,.0f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=None, help=f"names in bench/configs (default: {' '.join(DEFAULT_CONFIGS)})")
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 32, 16], help="micro-batches to try, largest first")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per repeat (at least 20 on the GPU)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer d=64 byte-vocabulary model, f32 (the CPU smoke path)")
    ap.add_argument("--no-compile", action="store_true", help="PyTorch eager (torch.compile's absence on torch 1.13 implies it)")
    ap.add_argument("--set", action="append", default=[], help="key.path=value override for both engines (repeatable)")
    ap.add_argument("--athanor", default=os.path.join(ROOT, "build", "apps", "athanor", "athanor"))
    ap.add_argument("--cwd", default=ROOT, help="where the engines run (athanor's data.cache_dir is relative to it)")
    ap.add_argument("--peak-tflops", type=float, default=H100_BF16_TFLOPS, help="MFU denominator (989: H100 SXM dense bf16)")
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting repeats/configs past this many seconds (0: none)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per athanor process")
    ap.add_argument("--torch-profile-steps", type=int, default=0,
                    help="after a config's timed repeats, profile this many more torch.compile steps (0: none)")
    ap.add_argument("--torch-profile-configs", nargs="+", default=None,
                    help="the configs --torch-profile-steps profiles (default: every config run)")
    ap.add_argument("--out", default=None, help="write every raw result as JSON here")
    ap.add_argument("--table", default=None, help="print the Markdown table of a saved --out file and exit")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        return torch_worker(args)
    if args.table:
        with open(args.table) as f:
            res = json.load(f)
        print(table(res, res.get("peak_tflops", args.peak_tflops)))
        return 0
    if args.device.startswith("cuda") and args.steps < 20:
        raise SystemExit(f"--steps {args.steps}: the GPU comparison times at least 20 steps (issue 22)")
    if args.torch_profile_steps < 0:
        raise SystemExit(f"--torch-profile-steps {args.torch_profile_steps}: give 0 (no profile) or a number of steps")
    if sorted(args.batches, reverse=True) != args.batches or min(args.batches) < 1:
        raise SystemExit(f"--batches {args.batches}: give positive sizes, largest first")
    if not os.access(args.athanor, os.X_OK):
        raise SystemExit(f"no athanor binary at {args.athanor}; build it (cmake --build build --target athanor_cli) or pass --athanor")
    budget = Budget(args.budget_s)
    configs = args.configs or (["gpt2-124m-gpu"] if args.tiny else DEFAULT_CONFIGS)
    results = {"device": args.device, "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
               "peak_tflops": args.peak_tflops, "batches": args.batches, "configs": []}
    if args.device.startswith("cuda"):
        try:
            results["device_name"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                                    capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            pass
    for i, name in enumerate(configs):
        # A config's cost, its torch profile left out (a later config may not be profiled).
        done = [r.get("wall_s", 0) - r.get("torch_profile", {}).get("wall_s", 0) for r in results["configs"]]
        if i > 0 and budget.left() < (max(done) if done else 0):
            results["configs"].append({"config": name, "repeats": [], "stopped": f"budget: {budget.left():.0f} s left"})
            log(f"[{name}] skipped: {budget.left():.0f} s of the budget left")
            continue
        rec = {"config": name, "repeats": []}
        results["configs"].append(rec)

        def save():
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
        compare_config(args, name, budget, rec, save)
        if rec.get("error"):
            log(f"[{name}] FAILED: {rec['error']}")
        save()
    print(table(results, args.peak_tflops))
    return 1 if any(r.get("error") for r in results["configs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
