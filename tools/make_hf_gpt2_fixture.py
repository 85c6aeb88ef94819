#!/usr/bin/python3
"""Writes tests/fixtures/hf_gpt2/: a tiny GPT-2 saved the way Hugging Face's
GPT-2 checkpoints on the Hub are laid out, and its logits for a batch of ids.

    /usr/bin/python3 tools/make_hf_gpt2_fixture.py

  model.safetensors  weights with HF names, no "transformer." prefix (as the Hub's
                     gpt2/model.safetensors), Conv1D weights in HF's [in, out]
                     layout, plus the attn.bias causal-mask buffers old HF
                     versions saved (an importer must ignore them)
  config.json        GPT2Config keys
  expected.safetensors  "ids" [B, T] i64 and "logits" [B, T, V] f32

transformers is not installed (Debian ships only python3-torch), so the model
below re-implements HF's modeling_gpt2 forward with its Conv1D
(y = x @ W + b, W [in, out]) and gelu_new; the safetensors file is written by
hand (8-byte LE header length, JSON header padded to 8, raw LE data).
"""
import json
import math
import os
import struct

import torch

L, H, D, NPOS, V = 2, 4, 64, 32, 101
B, T = 2, 12
g = torch.Generator().manual_seed(2024)


def rn(*shape, std=0.02):
    return torch.randn(*shape, generator=g, dtype=torch.float32) * std


# HF names without the "transformer." prefix; Conv1D weights [in, out].
P = {"wte.weight": rn(V, D), "wpe.weight": rn(NPOS, D, std=0.01)}
for i in range(L):
    p = f"h.{i}."
    P[p + "ln_1.weight"] = 1 + rn(D, std=0.1)
    P[p + "ln_1.bias"] = rn(D, std=0.1)
    P[p + "attn.bias"] = torch.tril(torch.ones(NPOS, NPOS)).view(1, 1, NPOS, NPOS)  # causal-mask buffer
    P[p + "attn.c_attn.weight"] = rn(D, 3 * D, std=0.2)
    P[p + "attn.c_attn.bias"] = rn(3 * D)
    P[p + "attn.c_proj.weight"] = rn(D, D, std=0.1)
    P[p + "attn.c_proj.bias"] = rn(D)
    P[p + "ln_2.weight"] = 1 + rn(D, std=0.1)
    P[p + "ln_2.bias"] = rn(D, std=0.1)
    P[p + "mlp.c_fc.weight"] = rn(D, 4 * D, std=0.1)
    P[p + "mlp.c_fc.bias"] = rn(4 * D)
    P[p + "mlp.c_proj.weight"] = rn(4 * D, D, std=0.05)
    P[p + "mlp.c_proj.bias"] = rn(D)
P["ln_f.weight"] = 1 + rn(D, std=0.1)
P["ln_f.bias"] = rn(D, std=0.1)


def conv1d(x, w, b):  # transformers.pytorch_utils.Conv1D.forward
    size_out = x.size()[:-1] + (w.size(-1),)
    return torch.addmm(b, x.reshape(-1, x.size(-1)), w).view(size_out)


def gelu_new(x):  # transformers.activations.NewGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def forward(ids):  # GPT2LMHeadModel.forward in eval mode (no dropout), computed in f64
    P64 = {k: v.double() for k, v in P.items()}
    Bn, Tn = ids.shape
    hd = D // H
    x = P64["wte.weight"][ids] + P64["wpe.weight"][torch.arange(Tn)]
    for i in range(L):
        p = f"h.{i}."
        h = torch.nn.functional.layer_norm(x, (D,), P64[p + "ln_1.weight"], P64[p + "ln_1.bias"], 1e-5)
        q, k, v = conv1d(h, P64[p + "attn.c_attn.weight"], P64[p + "attn.c_attn.bias"]).split(D, dim=2)
        q, k, v = [t.view(Bn, Tn, H, hd).permute(0, 2, 1, 3) for t in (q, k, v)]
        w = q @ k.transpose(-1, -2) / math.sqrt(hd)
        mask = P64[p + "attn.bias"][:, :, :Tn, :Tn].bool()
        w = torch.where(mask, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype)).softmax(-1)
        y = (w @ v).permute(0, 2, 1, 3).reshape(Bn, Tn, D)
        x = x + conv1d(y, P64[p + "attn.c_proj.weight"], P64[p + "attn.c_proj.bias"])
        h = torch.nn.functional.layer_norm(x, (D,), P64[p + "ln_2.weight"], P64[p + "ln_2.bias"], 1e-5)
        h = gelu_new(conv1d(h, P64[p + "mlp.c_fc.weight"], P64[p + "mlp.c_fc.bias"]))
        x = x + conv1d(h, P64[p + "mlp.c_proj.weight"], P64[p + "mlp.c_proj.bias"])
    x = torch.nn.functional.layer_norm(x, (D,), P64["ln_f.weight"], P64["ln_f.bias"], 1e-5)
    return x @ P64["wte.weight"].t()  # lm_head tied to wte


DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def write_safetensors(path, tensors, metadata):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        t = t.contiguous()
        data = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


ids = torch.randint(0, V, (B, T), generator=g)
logits = forward(ids).float()

config = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "vocab_size": V,
    "n_positions": NPOS,
    "n_ctx": NPOS,
    "n_embd": D,
    "n_layer": L,
    "n_head": H,
    "n_inner": None,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "resid_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "initializer_range": 0.02,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
}
out = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf_gpt2"))
os.makedirs(out, exist_ok=True)
write_safetensors(os.path.join(out, "model.safetensors"), P, {"format": "pt"})
write_safetensors(os.path.join(out, "expected.safetensors"), {"ids": ids, "logits": logits}, {"torch": torch.__version__})
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
print("wrote", out, "logits[0,0,:3]", logits[0, 0, :3].tolist())
