#!/usr/bin/python3
"""Writes tests/fixtures/gpt_tiny.safetensors: a tiny GPT-2 in PyTorch with
Hugging Face parameter names (weights in torch.nn.Linear layout [out, in]),
a batch of ids/targets, the logits, the mean cross-entropy loss, and the
gradient of the loss for every parameter ("grad.<name>").

    /usr/bin/python3 tools/make_gpt_fixture.py
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from make_fixtures import write_safetensors  # noqa: E402

L, H, D, BLOCK, V = 2, 2, 16, 16, 37
B, T = 2, 8
g = torch.Generator().manual_seed(1234)


def rn(*shape, std=0.02):
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * std).requires_grad_(True)


params = {"transformer.wte.weight": rn(V, D), "transformer.wpe.weight": rn(BLOCK, D)}
for i in range(L):
    p = f"transformer.h.{i}."
    params[p + "ln_1.weight"] = (1 + rn(D, std=0.1)).detach().requires_grad_(True)
    params[p + "ln_1.bias"] = rn(D, std=0.1)
    params[p + "attn.c_attn.weight"] = rn(3 * D, D)
    params[p + "attn.c_attn.bias"] = rn(3 * D)
    params[p + "attn.c_proj.weight"] = rn(D, D)
    params[p + "attn.c_proj.bias"] = rn(D)
    params[p + "ln_2.weight"] = (1 + rn(D, std=0.1)).detach().requires_grad_(True)
    params[p + "ln_2.bias"] = rn(D, std=0.1)
    params[p + "mlp.c_fc.weight"] = rn(4 * D, D)
    params[p + "mlp.c_fc.bias"] = rn(4 * D)
    params[p + "mlp.c_proj.weight"] = rn(D, 4 * D)
    params[p + "mlp.c_proj.bias"] = rn(D)
params["transformer.ln_f.weight"] = (1 + rn(D, std=0.1)).detach().requires_grad_(True)
params["transformer.ln_f.bias"] = rn(D, std=0.1)

ids = torch.randint(0, V, (B, T), generator=g)
targets = torch.randint(0, V, (B, T), generator=g)
targets[1, 3] = -100  # one ignored position


def forward(ids):
    P = params
    x = P["transformer.wte.weight"][ids] + P["transformer.wpe.weight"][torch.arange(T)]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (D,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], 1e-5)
        qkv = F.linear(h, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])
        q, k, v = qkv.split(D, dim=2)
        q, k, v = [t.view(B, T, H, D // H).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + F.linear(y, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (D,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], 1e-5)
        h = F.gelu(F.linear(h, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(h, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (D,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], 1e-5)
    return x @ P["transformer.wte.weight"].t()


logits = forward(ids)
loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-100)
loss.backward()

out = {"ids": ids, "targets": targets, "logits": logits, "loss": loss.reshape(1)}
for name, p in params.items():
    out[name] = p
    out["grad." + name] = p.grad
path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "gpt_tiny.safetensors")
write_safetensors(path, out, {"n_layer": L, "n_head": H, "n_embd": D, "block_size": BLOCK, "vocab_size": V, "torch": torch.__version__})
print("wrote", os.path.normpath(path), "loss", loss.item())
