#!/usr/bin/python3
"""The PyTorch twin of `athanor bench`: the same model, batch, optimizer and
precision as a bench/configs/*.yaml, timed the same way (W warm-up steps, then
N timed full training steps: forward + backward + grad clip + optimizer step +
zero_grad). Prints one JSON object in the schema of `athanor bench --json`.

    /usr/bin/python3 bench/pytorch_step.py bench/configs/tiny-gpt.yaml --precision bf16 --steps 10

The environment (out of the box vs tuned) is set by the caller
(bench/compare_pytorch.py), because OpenBLAS, OpenMP and glibc read it at load.

Models (shapes and ops as in athanor's nn::GPT / nn::Llama / nn::MLP):
  GPT-2: token + position embedding, pre-LN blocks (LayerNorm -> causal self-attention
  -> residual; LayerNorm -> Linear 4d -> GELU(tanh) -> Linear d -> residual), final
  LayerNorm, lm_head tied to the token embedding, cross-entropy over the vocabulary.
  torch 1.13 has no F.scaled_dot_product_attention, so attention is written out as a
  user of 1.13 would: q @ k^T * 1/sqrt(hd), causal mask, softmax, @ v.
  Llama: HF's LlamaForCausalLM eager path: RMSNorm, rotate_half RoPE, grouped-query
  attention by repeat_interleave of k/v (HF's repeat_kv), SwiGLU MLP, untied lm_head.
  MLP: Linear + ReLU layers, cross-entropy; SGD with momentum.
Data: random token ids / random images generated before timing (athanor's loader
prefetches on worker threads, so neither side times data loading).
"""
import argparse
import json
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml


class CausalSelfAttention(nn.Module):
    def __init__(self, d, h, T, bias):
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.c_proj = nn.Linear(d, d, bias=bias)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hd = C // self.h
        q = q.view(B, T, self.h, hd).transpose(1, 2)
        k = k.view(B, T, self.h, hd).transpose(1, 2)
        v = v.view(B, T, self.h, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, d, h, T, bias):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, elementwise_affine=True)
        self.attn = CausalSelfAttention(d, h, T, bias)
        self.ln_2 = nn.LayerNorm(d, elementwise_affine=True)
        self.c_fc = nn.Linear(d, 4 * d, bias=bias)
        self.c_proj = nn.Linear(4 * d, d, bias=bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, T, L, d, h, bias=True):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(T, d)
        self.blocks = nn.ModuleList([Block(d, h, T, bias) for _ in range(L)])
        self.ln_f = nn.LayerNorm(d)
        for n, p in self.named_parameters():  # GPT-2 init scheme (shapes matter here, not the values)
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") else 0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied lm_head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


class RMSNorm(nn.Module):  # HF's LlamaRMSNorm (f32 statistics)
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):  # HF's LlamaDecoderLayer, eager path (repeat_kv; torch 1.13 has no fused SDPA)
    def __init__(self, d, h, hkv, inter, eps):
        super().__init__()
        self.h, self.hkv, self.hd = h, hkv, d // h
        self.input_layernorm = RMSNorm(d, eps)
        self.q_proj = nn.Linear(d, h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, hkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, hkv * self.hd, bias=False)
        self.o_proj = nn.Linear(h * self.hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(y).view(B, T, self.hkv, self.hd).transpose(1, 2)
        v = self.v_proj(y).view(B, T, self.hkv, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.h // self.hkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = F.softmax(att.masked_fill(~mask[:, :, :T, :T], float("-inf")), dim=-1)
        x = x + self.o_proj((att @ v).transpose(1, 2).reshape(B, T, -1))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Llama(nn.Module):
    def __init__(self, vocab, T, L, d, h, hkv, inter, theta, eps):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([LlamaBlock(d, h, hkv, inter, eps) for _ in range(L)])
        self.norm = RMSNorm(d, eps)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        hd = d // h
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float32), inv)] * 2, dim=-1)
        self.register_buffer("cos", emb.cos()[None, None], persistent=False)
        self.register_buffer("sin", emb.sin()[None, None], persistent=False)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T), persistent=False)
        for n, p in self.named_parameters():  # HF init: N(0, 0.02) for Linear and Embedding weights
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:, :, :T].to(x.dtype), self.sin[:, :, :T].to(x.dtype)
        for b in self.layers:
            x = b(x, cos, sin, self.mask)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])])

    def forward(self, x, y):
        for i, l in enumerate(self.layers):
            x = l(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return F.cross_entropy(x.float(), y)


def no_decay(name, p):  # athanor: no weight decay on biases, norms, embeddings
    return p.dim() < 2 or "wte" in name or "wpe" in name or "embed_tokens" in name


def build(cfg):
    m, o, t = cfg["model"], cfg["optimizer"], cfg["trainer"]
    B = int(t["batch_size"])
    g = torch.Generator().manual_seed(int(cfg.get("seed", 0)))
    if m["type"] in ("gpt", "llama"):
        T, vocab = int(m["block_size"]), int(m["vocab_size"])
        if m["type"] == "gpt":
            model = GPT(vocab, T, int(m["n_layer"]), int(m["n_embd"]), int(m["n_head"]), bool(m.get("bias", True)))
        else:
            d, h = int(m["n_embd"]), int(m["n_head"])
            model = Llama(vocab, T, int(m["n_layer"]), d, h, int(m.get("n_kv_head", 0)) or h,
                          int(m.get("intermediate_size", 0)) or (8 * d // 3 + 63) // 64 * 64,
                          float(m.get("rope_theta", 10000.0)), float(m.get("rms_norm_eps", 1e-5)))
        n_batches = 4
        data = [(torch.randint(0, vocab, (B, T), generator=g), torch.randint(0, vocab, (B, T), generator=g))
                for _ in range(n_batches)]
        targets = B * T
    else:
        sizes = [int(s) for s in m["sizes"]]
        model = MLP(sizes)
        data = [(torch.rand(B, sizes[0], generator=g), torch.randint(0, sizes[-1], (B,), generator=g)) for _ in range(4)]
        targets = B
    params = list(model.named_parameters())
    if o["type"] == "adamw":
        groups = [{"params": [p for n, p in params if not no_decay(n, p)], "weight_decay": float(o.get("weight_decay", 0))},
                  {"params": [p for n, p in params if no_decay(n, p)], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=float(o["lr"]), betas=(float(o.get("beta1", 0.9)), float(o.get("beta2", 0.999))),
                                eps=float(o.get("eps", 1e-8)))
    elif o["type"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=float(o["lr"]), momentum=float(o.get("momentum", 0)))
    else:
        sys.exit(f"pytorch_step.py: optimizer {o['type']} is not mirrored; use adamw or sgd")
    return model, opt, data, targets, float(o.get("grad_clip", 0))


def flops_per_step(model, cfg, targets):
    m = cfg["model"]
    if m["type"] == "gpt":  # as athanor's training_flops_per_step: 6N + 12 L d T per token
        n = sum(p.numel() for name, p in model.named_parameters() if "wpe" not in name)
        return 6.0 * n * targets + 12.0 * int(m["n_layer"]) * int(m["n_embd"]) * int(m["block_size"]) * targets
    if m["type"] == "llama":  # as nn::Llama::flops_per_token: embed_tokens is a lookup, not a GEMM
        n = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
        return 6.0 * n * targets + 12.0 * int(m["n_layer"]) * int(m["n_embd"]) * int(m["block_size"]) * targets
    return 6.0 * sum(p.numel() for p in model.parameters()) * targets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--precision", default=None, help="f32 or bf16 (default: the config's trainer.precision)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--label", default="torch")
    args = ap.parse_args()
    cfg = yaml.safe_load(open(args.config))
    precision = args.precision or cfg["trainer"].get("precision", "f32")
    torch.set_num_threads(args.threads)
    torch.manual_seed(int(cfg.get("seed", 0)))
    model, opt, data, targets, clip = build(cfg)
    model.train()

    def step(i):
        x, y = data[i % len(data)]
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x, y)
        else:
            loss = model(x, y)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for i in range(args.warmup):
        step(i)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    times, loss = [], 0.0
    for i in range(args.steps):
        t0 = time.perf_counter()
        loss = step(args.warmup + i)
        times.append(time.perf_counter() - t0)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    s = sorted(times)
    k = len(s)
    median = s[k // 2] if k % 2 else 0.5 * (s[k // 2 - 1] + s[k // 2])
    flops = flops_per_step(model, cfg, targets)
    print(json.dumps({
        "engine": args.label, "name": cfg.get("name", ""), "model": cfg["model"]["type"], "precision": precision,
        "unit": "tokens" if cfg["model"]["type"] in ("gpt", "llama") else "samples", "targets_per_step": targets,
        "parameters": sum(p.numel() for p in model.parameters()), "warmup": args.warmup, "steps": args.steps,
        "step_ms": [t * 1e3 for t in times], "min_ms": s[0] * 1e3, "median_ms": median * 1e3, "max_ms": s[-1] * 1e3,
        "throughput": targets / median, "throughput_mean": targets * k / sum(s), "flops_per_step": flops,
        "achieved_gflops": flops / median * 1e-9,
        "minor_faults_per_step": (r1.ru_minflt - r0.ru_minflt) / args.steps,
        "major_faults_per_step": (r1.ru_majflt - r0.ru_majflt) / args.steps,
        "final_loss": loss, "torch": torch.__version__, "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
