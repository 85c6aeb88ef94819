#!/usr/bin/python3
"""Writes PyTorch reference fixtures for athanor's op tests into tests/fixtures/.

Run with Debian's Python and PyTorch (apt-get install python3-torch python3-numpy):

    /usr/bin/python3 tools/make_fixtures.py            # writes tests/fixtures/*.safetensors
    /usr/bin/python3 tools/make_fixtures.py --out DIR  # somewhere else

Every fixture file is a safetensors file written by the tiny writer below (no
dependency on the `safetensors` package): an 8-byte little-endian header length,
a JSON header {name: {dtype, shape, data_offsets}} with sorted keys, padded with
spaces to a multiple of 8, then raw little-endian row-major data in key order.

Each case stores its inputs, the forward output `out`, an upstream gradient
`gout`, and `grad.<input>` = d<out, gout>/d<input> computed by torch.autograd.
Values are f64 so that comparisons test the op, not rounding; integer targets are
i64; a few f32 cases (named "f32.*") hold PyTorch's own f32 results.

Seeds are fixed per case (a torch.Generator per case), so adding a case does not
change the others, and the output is byte-for-byte deterministic for a given
PyTorch build.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

_DTYPES = {torch.float64: ("F64", "<f8"), torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8")}


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: torch.Tensor}; written in sorted-name order."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: unsupported dtype {t.dtype}")
        tag, np_dtype = _DTYPES[t.dtype]
        raw = t.numpy().astype(np_dtype, copy=False).tobytes(order="C")
        header[name] = {"dtype": tag, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


class Case:
    """Collects the tensors of one case under a key prefix."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def randn(self, *shape, dtype=torch.float64, scale=1.0, shift=0.0):
        return (torch.randn(tuple(shape), generator=self.g, dtype=torch.float64) * scale + shift).to(dtype)

    def leaf(self, *shape, **kw):
        return self.randn(*shape, **kw).requires_grad_(True)


def run_case(seed, make_inputs, fn, prefix=""):
    """make_inputs(case) -> ordered dict of leaves (non-float entries are constants);
    fn(**inputs) -> output. Returns the flattened fixture entries."""
    c = Case(seed)
    inputs = make_inputs(c)
    out = fn(**inputs)
    gout = c.randn(*out.shape, dtype=out.dtype)
    grads = torch.autograd.grad(out, [v for v in inputs.values() if v.requires_grad], gout)
    entries = {prefix + k: v for k, v in inputs.items()}
    entries[prefix + "out"] = out
    entries[prefix + "gout"] = gout
    for (k, _), gr in zip([(k, v) for k, v in inputs.items() if v.requires_grad], grads):
        entries[prefix + "grad." + k] = gr
    return entries


# ---------------------------------------------------------------- op fixtures


def fx_matmul():
    e = {}
    # batched with broadcast of a 2-D right operand
    e.update(run_case(101, lambda c: dict(a=c.leaf(2, 3, 4, 5), b=c.leaf(5, 6)), lambda a, b: a @ b, "batched_2d."))
    # both operands broadcast in their batch dims
    e.update(run_case(102, lambda c: dict(a=c.leaf(2, 1, 4, 5), b=c.leaf(3, 5, 6)), lambda a, b: a @ b, "broadcast_both."))
    # 1-D left operand promoted to a row and the added dim removed
    e.update(run_case(103, lambda c: dict(a=c.leaf(5), b=c.leaf(2, 5, 6)), lambda a, b: a @ b, "vec_left."))
    return e


def fx_linear():
    e = {}
    e.update(run_case(201, lambda c: dict(x=c.leaf(2, 3, 5), weight=c.leaf(4, 5), bias=c.leaf(4)),
                      lambda x, weight, bias: F.linear(x, weight, bias), "bias."))
    e.update(run_case(202, lambda c: dict(x=c.leaf(3, 5), weight=c.leaf(4, 5)),
                      lambda x, weight: F.linear(x, weight), "nobias."))
    return e


def fx_layer_norm():
    # rows with a non-zero mean and non-unit spread, so centring and scaling both matter
    def inputs(c):
        return dict(x=c.leaf(2, 3, 8, scale=2.0, shift=0.5), weight=c.leaf(8, scale=0.3, shift=1.0), bias=c.leaf(8, scale=0.3))
    return run_case(301, inputs, lambda x, weight, bias: F.layer_norm(x, (8,), weight, bias, eps=1e-5))


def fx_gelu():
    def inputs(c):
        # a sweep across the interesting range plus random points
        sweep = torch.linspace(-6.0, 6.0, 49, dtype=torch.float64)
        return dict(x=torch.cat([sweep, c.randn(31, scale=2.0)]).reshape(5, 16).requires_grad_(True))
    e = {}
    e.update(run_case(401, inputs, lambda x: F.gelu(x), "exact."))
    e.update(run_case(401, inputs, lambda x: F.gelu(x, approximate="tanh"), "tanh."))
    # f32: PyTorch's own f32 results, for an f32-tolerance check of the f32 kernels
    def inputs32(c):
        return dict(x=c.leaf(4, 16, scale=2.0, dtype=torch.float32))
    e.update(run_case(402, inputs32, lambda x: F.gelu(x), "f32.exact."))
    e.update(run_case(402, inputs32, lambda x: F.gelu(x, approximate="tanh"), "f32.tanh."))
    return e


def fx_softmax():
    def inputs(c):
        x = c.randn(3, 4, 7, scale=3.0)
        x[1, 2] += 1000.0  # a row far from 0: only a max-subtracted softmax survives it
        x[2, 0] -= 1000.0
        return dict(x=x.requires_grad_(True))
    e = {}
    e.update(run_case(501, inputs, lambda x: F.softmax(x, dim=-1), "softmax."))
    e.update(run_case(501, inputs, lambda x: F.log_softmax(x, dim=-1), "log_softmax."))
    return e


def fx_cross_entropy():
    def inputs(ignore):
        def f(c):
            logits = c.leaf(6, 5, scale=2.0)
            target = torch.randint(0, 5, (6,), generator=c.g, dtype=torch.int64)
            if ignore:
                target[1] = -100
                target[4] = -100
            return dict(logits=logits, target=target)
        return f
    e = {}
    e.update(run_case(601, inputs(False), lambda logits, target: F.cross_entropy(logits, target), "plain."))
    e.update(run_case(602, inputs(True), lambda logits, target: F.cross_entropy(
        logits, target, ignore_index=-100, label_smoothing=0.1), "ignore_smooth."))
    e.update(run_case(603, inputs(True), lambda logits, target: F.cross_entropy(
        logits, target, ignore_index=-100, label_smoothing=0.1, reduction="sum"), "ignore_smooth_sum."))
    e.update(run_case(604, inputs(True), lambda logits, target: F.cross_entropy(
        logits, target, ignore_index=-100, label_smoothing=0.1, reduction="none"), "ignore_smooth_none."))
    return e


def sdpa_math(q, k, v, is_causal=False, scale=None):
    """softmax(q k^T * scale + causal mask) v, the way PyTorch 2 defines it (top-left aligned mask)."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        tq, tk = q.shape[-2], k.shape[-2]
        keep = torch.ones(tq, tk, dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def fx_attention():
    def qkv(tq, tk):
        return lambda c: dict(q=c.leaf(2, 2, tq, 4), k=c.leaf(2, 2, tk, 4), v=c.leaf(2, 2, tk, 4))
    e = {}
    e.update(run_case(701, qkv(5, 5), lambda q, k, v: sdpa_math(q, k, v), "noncausal."))
    e.update(run_case(702, qkv(5, 5), lambda q, k, v: sdpa_math(q, k, v, is_causal=True), "causal."))
    e.update(run_case(703, qkv(3, 6), lambda q, k, v: sdpa_math(q, k, v), "noncausal_rect."))
    e.update(run_case(704, qkv(3, 6), lambda q, k, v: sdpa_math(q, k, v, is_causal=True), "causal_rect."))
    e.update(run_case(705, qkv(5, 5), lambda q, k, v: sdpa_math(q, k, v, scale=0.3), "scale0.3."))
    return e


# ------------------------------------------------------ GPT-2 block stack

GPT_B, GPT_T, GPT_D, GPT_H, GPT_L = 2, 8, 16, 2, 2


def gpt_block_stack(x, w):
    """x: [B, T, d]; w: {name: tensor} with Linear weights in [out, in] layout."""
    B, T, d = x.shape
    H = GPT_H
    for i in range(GPT_L):
        p = f"h.{i}."
        h = F.layer_norm(x, (d,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps=1e-5)
        qkv = F.linear(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"])  # [B, T, 3d]
        q, k, v = qkv.split(d, dim=-1)
        q, k, v = (t.reshape(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))  # [B, H, T, d/H]
        a = sdpa_math(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        x = x + F.linear(a, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (d,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps=1e-5)
        m = F.gelu(F.linear(h, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(m, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
    return x


def fx_gpt2_blocks():
    d = GPT_D
    shapes = {}
    for i in range(GPT_L):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (d,), p + "ln_1.bias": (d,),
            p + "attn.c_attn.weight": (3 * d, d), p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
            p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (4 * d, d), p + "mlp.c_fc.bias": (4 * d,),
            p + "mlp.c_proj.weight": (d, 4 * d), p + "mlp.c_proj.bias": (d,),
        })

    def inputs(c):
        leaves = {"x": c.leaf(GPT_B, GPT_T, d)}
        for name in sorted(shapes):
            shp = shapes[name]
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight"):
                leaves[name] = c.leaf(*shp, scale=0.1, shift=1.0)
            elif name.endswith(".bias"):
                leaves[name] = c.leaf(*shp, scale=0.1)
            else:  # weights: about 1/sqrt(fan_in), so activations stay O(1)
                leaves[name] = c.leaf(*shp, scale=1.0 / math.sqrt(shp[1]))
        return leaves

    def fn(x, **w):
        return gpt_block_stack(x, w)

    return run_case(801, inputs, fn)


FIXTURES = {
    "matmul": fx_matmul,
    "linear": fx_linear,
    "layer_norm": fx_layer_norm,
    "gelu": fx_gelu,
    "softmax": fx_softmax,
    "cross_entropy": fx_cross_entropy,
    "attention": fx_attention,
    "gpt2_blocks": fx_gpt2_blocks,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.normpath(os.path.join(here, "..", "tests", "fixtures")))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    total = 0
    for name, make in FIXTURES.items():
        entries = make()
        path = os.path.join(args.out, name + ".safetensors")
        write_safetensors(path, entries, {"generator": "tools/make_fixtures.py", "torch": torch.__version__})
        size = os.path.getsize(path)
        total += size
        print(f"{path}: {len(entries)} tensors, {size} bytes")
    print(f"total {total} bytes")
    if total >= 1 << 20:
        sys.exit("fixtures exceed 1 MB")


if __name__ == "__main__":
    main()
