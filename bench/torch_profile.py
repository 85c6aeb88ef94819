"""Where a PyTorch training step's device time goes, by kernel category (issue 22): the reading of
a torch.profiler run that bench/compare_pytorch_gpu.py --torch-profile-steps makes of
torch.compile's step, beside athanor's own op profile.

kernel_category(name) sorts a kernel by its name into CATEGORIES; a name no rule knows is
"other", never a guess. The rules follow the names the libraries give their kernels:
  - Triton kernels from Inductor are triton_{poi,red,per,tem,for}_fused_<origin aten ops>_<n>:
    a template (tem) carrying mm/addmm/bmm is a GEMM, one carrying attention an attention; one
    from _log_softmax / nll_loss is the cross-entropy; one from _foreach / adam the optimizer;
    every other (the pointwise, reduction and persistent-reduction fusions) is "triton". A
    triton_poi kernel named after addmm is the bias add left beside an extern cuBLAS GEMM, so it
    stays "triton".
  - attention: FlashAttention (pytorch_flash::flash_fwd_kernel, flash_bwd_*), memory-efficient
    (fmha_cutlassF/B ... PyTorchMemEffAttention), cuDNN's (cudnn_generated_fort_native_sdpa_*).
    Tested before the GEMMs: FlashAttention's template arguments name cutlass types, cuDNN's
    wgmma.
  - gemm: cuBLAS/cuBLASLt (sm90_xmma_gemm_*, nvjet_*, ampere_*gemm*, gemv*, splitKreduce_kernel,
    cublasLt::*), CUTLASS (cutlass::Kernel*, cutlass_80_tensorop_*).
  - cross_entropy: eager log_softmax (cunn_SoftMaxForward<... LogSoftMaxForwardEpilogue>) and
    nll_loss_{forward,backward}_* kernels.
  - optimizer: multi_tensor_apply_kernel (fused AdamW's FusedAdamMathFunctor, clip_grad_norm_'s
    foreach norm and scale) and lpnorm_cleanup (the foreach norm's second pass): the optimizer
    step with its grad clip.
  - memcpy_memset: the profiler's "Memcpy HtoD (Pageable -> Device)", "Memset (Device)" records.
On the CPU's dry run the records are aten ops: aten::mm / addmm / bmm / baddbmm count as GEMMs,
the rest by the same rules.
"""
import re

CATEGORIES = ("gemm", "attention", "triton", "optimizer", "cross_entropy", "memcpy_memset", "other")

_ATTENTION = re.compile(r"flash|fmha|sdpa|attention")
_GEMM = re.compile(r"gemm|gemv|nvjet|xmma|cublas|cutlass|splitkreduce|^aten::(addmm|mm|bmm|baddbmm)$")
_CROSS_ENTROPY = re.compile(r"nll_loss|log_?softmax|cross_entropy")
_OPTIMIZER = re.compile(r"multi_tensor_apply|lpnorm_cleanup|adam|foreach")
_TRITON = re.compile(r"^triton_(poi|red|per|tem|for)_")
_TEMPLATE_GEMM_TOKENS = {"mm", "addmm", "bmm", "baddbmm"}


def kernel_category(name):
    """The category in CATEGORIES of a device kernel (or, on the CPU's dry run, an aten op) by its name."""
    n = name.strip().lower()
    if n.startswith(("memcpy", "memset")):
        return "memcpy_memset"
    m = _TRITON.match(n)
    if m:
        if m.group(1) == "tem":
            if _ATTENTION.search(n):
                return "attention"
            if _TEMPLATE_GEMM_TOKENS & set(n.split("_")):
                return "gemm"
        return _first_match(n, _FUSED_RULES, "triton")
    return _first_match(n, ((_ATTENTION, "attention"), (_GEMM, "gemm")) + _FUSED_RULES, "other")


# A fused kernel named after the loss or the optimizer it computes belongs there, Triton's or not.
_FUSED_RULES = ((_CROSS_ENTROPY, "cross_entropy"), (_OPTIMIZER, "optimizer"))


def _first_match(name, rules, default):
    for pattern, category in rules:
        if pattern.search(name):
            return category
    return default


def summarize(events, steps, top=15):
    """events: (name, microseconds, calls) of every device record over `steps` profiled steps.
    The device time per step in all and by category (ms, share, distinct kernels), and the `top`
    kernels by time (full names up to 500 characters)."""
    if steps <= 0:
        raise ValueError(f"summarize: steps must be positive, got {steps}")
    by_name = {}
    for name, us, calls in events:
        t, c = by_name.get(name, (0.0, 0))
        by_name[name] = (t + float(us), c + int(calls))
    total_us = sum(t for t, _ in by_name.values())
    cats = {c: {"ms_per_step": 0.0, "share": 0.0, "kernels": 0} for c in CATEGORIES}
    for name, (us, _) in by_name.items():
        e = cats[kernel_category(name)]
        e["ms_per_step"] += us / steps / 1e3
        e["kernels"] += 1
    for e in cats.values():
        e["share"] = round(e["ms_per_step"] * steps * 1e3 / total_us, 4) if total_us > 0 else 0.0
        e["ms_per_step"] = round(e["ms_per_step"], 4)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {"steps": steps, "device_ms_per_step": round(total_us / steps / 1e3, 4), "categories": cats,
            "top_kernels": [{"name": n[:500], "category": kernel_category(n), "ms_per_step": round(us / steps / 1e3, 4),
                             "calls_per_step": round(c / steps, 2), "share": round(us / total_us, 4) if total_us > 0 else 0.0}
                            for n, (us, c) in ranked]}


def device_records(prof, cuda):
    """(name, microseconds, calls) from a finished torch.profiler.profile: each CUDA device record
    (kernels, memcpy, memset) on the GPU; on the CPU (the dry run) each op's self CPU time, so
    that the plumbing runs there too (its categories then describe aten ops, not kernels)."""
    if cuda:
        return [(e.name, e.time_range.elapsed_us(), 1) for e in prof.events() if str(e.device_type).endswith("CUDA")]
    return [(e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()]


def short_name(name, width=90):
    """A kernel's name cut for a Markdown cell: without the leading 'void ', its '|' escaped."""
    n = name[5:] if name.startswith("void ") else name
    n = n if len(n) <= width else n[:width - 1] + "…"
    return n.replace("|", "\\|")


def markdown(config, prof, engine="torch.compile", top=15):
    """The short tables of one config's profile for the Markdown output."""
    cats = prof["categories"]
    lines = [f"{engine}'s step on the device, {config} (batch {prof.get('batch', '?')}, {prof['steps']} profiled steps, "
             f"{prof.get('device', '?')}): {prof['device_ms_per_step']:.1f} ms of device time per step"
             + (f" against {prof['step_ms']:.1f} ms wall per profiled step" if prof.get("step_ms") else "") + ".", "",
             "| category | ms/step | share | kernels |", "|---|---|---|---|"]
    for c in sorted(CATEGORIES, key=lambda c: -cats[c]["ms_per_step"]):
        lines.append(f"| {c} | {cats[c]['ms_per_step']:.2f} | {100 * cats[c]['share']:.1f}% | {cats[c]['kernels']} |")
    lines += ["", f"| top {min(top, len(prof['top_kernels']))} kernels | category | ms/step | calls/step |", "|---|---|---|---|"]
    for k in prof["top_kernels"][:top]:
        lines.append(f"| `{short_name(k['name'])}` | {k['category']} | {k['ms_per_step']:.3f} | {k['calls_per_step']:g} |")
    return lines


def loaded_libraries(prefixes=("libcublas", "libcudnn", "libnccl")):
    """The shared libraries of this process whose file names start with one of prefixes: which
    cuBLAS torch really runs (its wheel's, or the one LD_LIBRARY_PATH put first)."""
    found = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[-1].rsplit("/", 1)[-1].startswith(prefixes):
                    found.add(parts[-1])
    except OSError:
        pass
    return sorted(found)
