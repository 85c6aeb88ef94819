#!/usr/bin/env python3
"""The summary of scripts/gpu_check.sh run (its last step, on the GPU machine): every step's
status and the headline of every file the steps wrote, into one JSON file (--out), printed too.

Exits 1 unless the established checks all passed ("ok"); the candidates' pass has its own verdict
(candidates_ok) and the benchmarks' numbers are reported, never judged. A file a step did not
write becomes a "report" saying so, never a failure of this script. gemm_vs_torch holds
bench_cuda_gemm's GEMMs against the same GEMMs run by PyTorch (bench/torch_gemm_shapes.py): ms
ours ÷ ms torch per GEMM name, above 1 where ours is slower.
"""
import argparse
import json
import subprocess
import sys


OPTIONS = ("out", "tests-json", "tests-status", "tests-s", "train-status", "bench-json", "bench-status", "parity-status",
           "parity-bf16-status", "attn-json", "attn-status", "pointwise-txt", "dist-status", "cand-json", "cand-status",
           "cand-s", "gemm-json", "gemm-status", "torch-gemm-json", "torch-gemm-status")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in OPTIONS:  # the steps' status strings and the files they wrote (absent ones are reported)
        ap.add_argument("--" + name, required=True)
    return ap.parse_args(argv)


def load(path):
    with open(path) as f:
        return json.load(f)


def gtest_summary(entry, report):
    try:
        r = load(report)
        cases = [c for s in r.get("testsuites", []) for c in s.get("testsuite", [])]
        entry.update(total=len(cases), crashed_suites=r.get("crashed", []),
                     failed=[c["classname"] + "." + c["name"] for c in cases if c.get("failures")],
                     skipped=[c["classname"] + "." + c["name"] for c in cases if c.get("result") == "SKIPPED"])
    except Exception as e:  # a crash before gtest wrote its file
        entry["report"] = "no gtest report: %s" % e


def gemm_vs_torch(ours, torch, torch_status):
    """ms ours ÷ ms torch for every GEMM name both timed (> 0 ms), and for the step's GEMM total;
    the names one side lacks or did not time, listed."""
    out = {"status": torch_status, "meaning": "ms bench_cuda_gemm / ms torch at the same shape: above 1, ours is slower",
           "torch": torch.get("torch"), "cuda": torch.get("cuda"), "gpu": torch.get("gpu"),
           "torch_libraries": torch.get("libraries"), "torch_step_gemm_ms": torch.get("step_gemm_ms")}
    if ours.get("rows") != torch.get("rows") or ours.get("d") != torch.get("d") or ours.get("dtype") != torch.get("dtype"):
        out["report"] = ("the two benches ran different shapes: ours rows %s d %s %s, torch rows %s d %s %s"
                         % (ours.get("rows"), ours.get("d"), ours.get("dtype"), torch.get("rows"), torch.get("d"), torch.get("dtype")))
        return out
    t_ms = {g["gemm"]: g.get("ms", -1) for g in torch.get("gemms", [])}
    ratios, missing = {}, []
    for g in ours.get("gemms", []):
        a, b = g.get("ms", -1), t_ms.get(g["gemm"], -1)
        if a > 0 and b > 0:
            ratios[g["gemm"]] = round(a / b, 3)
        else:
            missing.append(g["gemm"])
    missing += [n for n in t_ms if n not in ratios and n not in missing]
    out["gemms"] = ratios
    if missing:
        out["not_compared"] = missing
    a, b = ours.get("step_gemm_ms") or 0, torch.get("step_gemm_ms") or 0
    out["step_gemm"] = round(a / b, 3) if a > 0 and b > 0 else None
    return out


def summarize(a):
    summary = {"tests": {"status": a.tests_status, "seconds": int(a.tests_s)}, "train_gpt_char_200": a.train_status,
               "parity_cpu_cuda_f32": a.parity_status, "parity_cpu_cuda_bf16": a.parity_bf16_status,
               "bench_gpt2_124m": {"status": a.bench_status}, "attention_bench": {"status": a.attn_status}}
    try:
        with open(a.dist_status) as f:
            summary["gpu_dist"] = dict(l.rstrip("\n").split(": ", 1) for l in f if ": " in l)
    except Exception as e:
        summary["gpu_dist"] = {"report": "no status from the gpu;dist step: %s" % e}
    if not summary["gpu_dist"]:
        summary["gpu_dist"] = {"report": "the gpu;dist step wrote no status"}
    try:
        b = load(a.bench_json)
        summary["bench_gpt2_124m"].update({k: b.get(k) for k in ("device", "precision", "throughput", "median_ms", "mfu",
                                                                 "peak_gflops", "peak_source", "peak_bytes", "reserved_bytes")})
    except Exception as e:
        summary["bench_gpt2_124m"]["report"] = "no JSON from athanor bench: %s" % e
    try:  # bench_cuda_pointwise: a table, then one JSON line
        with open(a.pointwise_txt) as f:
            summary["pointwise_bench"] = json.loads([l for l in f if l.startswith("{")][-1])
    except Exception as e:
        summary["pointwise_bench"] = {"report": "no JSON from bench_cuda_pointwise: %s" % e}
    summary["gemm_bench"] = {"status": a.gemm_status}
    gb = None
    try:  # the headline only; gemm_bench.json has every GEMM
        gb = load(a.gemm_json)
        summary["gemm_bench"].update({k: gb.get(k) for k in ("gpu", "rows", "step_gemm_ms", "step_gemm_tflops")})
    except Exception as e:
        summary["gemm_bench"]["report"] = "no JSON from bench_cuda_gemm: %s" % e
    # The same GEMMs in PyTorch (torch_gemm_bench.json has every one): ours ÷ torch per GEMM.
    torch_status = a.torch_gemm_status
    try:
        tb = load(a.torch_gemm_json)
        if tb.get("skipped"):
            torch_status = "skipped: " + tb["skipped"]
            summary["gemm_vs_torch"] = {"status": torch_status}
        elif gb is None:
            summary["gemm_vs_torch"] = {"status": torch_status, "report": "nothing to compare: no JSON from bench_cuda_gemm"}
        else:
            summary["gemm_vs_torch"] = gemm_vs_torch(gb, tb, torch_status)
    except Exception as e:
        summary["gemm_vs_torch"] = {"status": torch_status, "report": "no JSON from torch_gemm_shapes.py: %s" % e}
    try:
        summary["attention_bench"].update(load(a.attn_json))
    except Exception as e:
        summary["attention_bench"]["report"] = "no JSON from bench_cuda_attention: %s" % e
    gtest_summary(summary["tests"], a.tests_json)
    # The same tests with every CUDA candidate on (ATHANOR_CUDA_CANDIDATES=all): not part of "ok" (the
    # candidates are off by default); candidates_ok says whether they can be made the default.
    summary["tests_candidates"] = {"status": a.cand_status, "seconds": int(a.cand_s)}
    if not a.cand_status.startswith("skipped"):
        gtest_summary(summary["tests_candidates"], a.cand_json)
    try:
        summary["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:
        summary["gpu"] = "nvidia-smi: %s" % e
    # On the GPU machine a skipped gpu test means the GPU was not seen: that is a failure.
    summary["ok"] = (a.tests_status == "passed" and not summary["tests"].get("skipped") and not summary["tests"].get("failed")
                     and a.attn_status == "passed"
                     and a.train_status.startswith("passed") and a.bench_status == "passed" and a.parity_status.startswith("passed")
                     and a.parity_bf16_status.startswith("passed")
                     and all(str(v).startswith("passed") for v in summary["gpu_dist"].values()))
    summary["candidates_ok"] = (a.cand_status == "passed" and not summary["tests_candidates"].get("skipped")
                                and not summary["tests_candidates"].get("failed"))
    return summary


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    summary = summarize(a)
    with open(a.out, "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
