#!/usr/bin/python3
"""Writes tests/fixtures/llama_tiny*.safetensors: a tiny Llama in plain PyTorch that
follows Hugging Face's modeling_llama.py (LlamaForCausalLM) term by term, with HF's
parameter names (weights in torch.nn.Linear layout [out, in]), a batch of
ids/targets, the logits, the mean cross-entropy loss, and the gradient of the loss
for every parameter ("grad.<name>").

    /usr/bin/python3 tools/make_llama_fixture.py

Three variants (one file each):
  llama_tiny.safetensors               rope_theta 10000, untied lm_head
  llama_tiny_rope_llama3.safetensors   rope_theta 500000 with Llama 3.1's "llama3" frequency
                                       scaling (factor 8, low 1, high 4, original 8192): with
                                       head dim 8 the four frequencies fall in the kept, the
                                       smoothed and the divided bands
  llama_tiny_tied.safetensors          tie_word_embeddings: lm_head is embed_tokens (no
                                       lm_head.weight key, as HF saves it)

What follows HF exactly: LlamaRMSNorm (mean of squares over the last dim, eps inside
the rsqrt, weight only, computed in at least f32), rotate_half RoPE (pairs i, i + D/2,
cos/sin of position * inv_freq repeated twice), _compute_llama3_parameters for the
scaling, repeat_kv for grouped-query attention, causal softmax attention scaled by
1/sqrt(head_dim), the MLP down(silu(gate(x)) * up(x)), no biases anywhere, the final
norm and lm_head. Two deliberate precision differences, so that an f64 model can be
compared to 1e-10: HF computes inv_freq and cos/sin in f32 and casts the RMSNorm input
to f32; here they stay in f64 (the formulas are the same).
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from make_fixtures import write_safetensors  # noqa: E402

L, H, HKV, D, I, V = 2, 4, 2, 32, 48, 61
HD = D // H
B, T = 2, 7  # T is not a multiple of any kernel tile
EPS = 1e-5
MAX_POS = 64


def inv_freq(theta, scaling):
    f = 1.0 / (theta ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    if scaling is None:
        return f
    # transformers' _compute_llama3_parameters
    factor, low, high, old = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"], scaling[
        "original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / f
    f_llama = torch.where(wavelen > low_wavelen, f / factor, f)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * f_llama / factor + smooth * f_llama
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, f_llama)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rms_norm(x, w):
    dt = x.dtype
    h = x.to(torch.promote_types(dt, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(dt)


def repeat_kv(x, n_rep):  # [B, Hkv, T, D] -> [B, Hkv * n_rep, T, D]
    b, hkv, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, hkv, n_rep, t, d).reshape(b, hkv * n_rep, t, d)


def make(name, seed, theta, scaling, tied):
    g = torch.Generator().manual_seed(seed)

    def rn(*shape, std):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * std).requires_grad_(True)

    def norm_w():  # near 1, not exactly, so a missing weight multiply is seen
        return (1 + torch.randn(D, generator=g, dtype=torch.float64) * 0.1).requires_grad_(True)

    P = {"model.embed_tokens.weight": rn(V, D, std=0.3 if tied else 1.0)}  # tied: it is the lm_head too
    for i in range(L):
        p = f"model.layers.{i}."
        P[p + "input_layernorm.weight"] = norm_w()
        # q/k larger than HF's 0.02 init so the attention is far from uniform and RoPE matters
        P[p + "self_attn.q_proj.weight"] = rn(H * HD, D, std=0.3)
        P[p + "self_attn.k_proj.weight"] = rn(HKV * HD, D, std=0.3)
        P[p + "self_attn.v_proj.weight"] = rn(HKV * HD, D, std=0.2)
        P[p + "self_attn.o_proj.weight"] = rn(D, H * HD, std=0.2)
        P[p + "post_attention_layernorm.weight"] = norm_w()
        P[p + "mlp.gate_proj.weight"] = rn(I, D, std=0.2)
        P[p + "mlp.up_proj.weight"] = rn(I, D, std=0.2)
        P[p + "mlp.down_proj.weight"] = rn(D, I, std=0.2)
    P["model.norm.weight"] = norm_w()
    if not tied:
        P["lm_head.weight"] = rn(V, D, std=0.2)

    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    targets[1, 3] = -100  # one ignored position

    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(theta, scaling))  # [T, HD/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # [1, 1, T, HD]
    mask = torch.ones(T, T, dtype=torch.bool).tril()

    x = P["model.embed_tokens.weight"][ids]
    for i in range(L):
        p = f"model.layers.{i}."
        h = rms_norm(x, P[p + "input_layernorm.weight"])
        q = F.linear(h, P[p + "self_attn.q_proj.weight"]).view(B, T, H, HD).transpose(1, 2)
        k = F.linear(h, P[p + "self_attn.k_proj.weight"]).view(B, T, HKV, HD).transpose(1, 2)
        v = F.linear(h, P[p + "self_attn.v_proj.weight"]).view(B, T, HKV, HD).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # apply_rotary_pos_emb
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // HKV), repeat_kv(v, H // HKV)
        att = (q @ k.transpose(2, 3)) / math.sqrt(HD)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * HD)
        x = x + F.linear(y, P[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"])
        m = F.silu(F.linear(h, P[p + "mlp.gate_proj.weight"])) * F.linear(h, P[p + "mlp.up_proj.weight"])
        x = x + F.linear(m, P[p + "mlp.down_proj.weight"])
    x = rms_norm(x, P["model.norm.weight"])
    logits = F.linear(x, P["model.embed_tokens.weight"] if tied else P["lm_head.weight"])
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
    loss.backward()

    out = {"ids": ids, "targets": targets, "logits": logits, "loss": loss.reshape(1)}
    for n, p in P.items():
        out[n] = p
        out["grad." + n] = p.grad
    md = {"n_layer": L, "n_head": H, "n_kv_head": HKV, "n_embd": D, "intermediate_size": I, "vocab_size": V,
          "max_position_embeddings": MAX_POS, "rms_norm_eps": repr(EPS), "rope_theta": repr(float(theta)),
          "tie_word_embeddings": "true" if tied else "false", "torch": torch.__version__}
    if scaling is not None:
        md.update({"rope_scaling.factor": repr(float(scaling["factor"])),
                   "rope_scaling.low_freq_factor": repr(float(scaling["low_freq_factor"])),
                   "rope_scaling.high_freq_factor": repr(float(scaling["high_freq_factor"])),
                   "rope_scaling.original_max_position_embeddings": scaling["original_max_position_embeddings"]})
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", name)
    write_safetensors(path, out, md)
    print("wrote", os.path.normpath(path), "loss", loss.item())


make("llama_tiny.safetensors", 4321, 10000.0, None, False)
make("llama_tiny_rope_llama3.safetensors", 4322, 500000.0,
     {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, False)
make("llama_tiny_tied.safetensors", 4323, 10000.0, None, True)
