"""The host-side parts of scripts/gpu_check.sh and scripts/gpu_bench.sh that can be checked without
a GPU (issue 22): the summary script on fake step outputs (gemm_vs_torch: ours ÷ torch per GEMM,
a skipped or missing torch bench, "ok"), that gpu_check.sh calls it with exactly its options, that
the pack carries every bench script the GPU machine runs and the modules they import, and that
gpu_bench.sh profiles torch.compile for gpt2-124m-gpu with options compare_pytorch_gpu.py has.

    python3 tests/bench/test_gpu_check_summary.py
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMMARY = os.path.join(ROOT, "scripts", "gpu_check_summary.py")
CHECK_SH = os.path.join(ROOT, "scripts", "gpu_check.sh")
BENCH_SH = os.path.join(ROOT, "scripts", "gpu_bench.sh")


def read(path):
    with open(path) as f:
        return f.read()


def gemm_json(engine_ms, step, **top):
    """A bench_cuda_gemm / torch_gemm_shapes line at rows 16384, d 768, bf16 with the given ms per GEMM."""
    out = {"bench": "cuda_gemm", "gpu": "NVIDIA H200", "dtype": "bf16", "rows": 16384, "d": 768, "layers": 12,
           "vocab": 50304, "step_gemm_ms": step, "step_gemm_tflops": 500.0,
           "gemms": [{"gemm": n, "m": 1, "n": 1, "k": 1, "per_step": 12, "in_step": True, "ms": ms, "tflops": 1.0}
                     for n, ms in engine_ms]}
    out.update(top)
    return out


class Summary(unittest.TestCase):
    def run_summary(self, d, files, **status):
        paths = {}
        for name, content in files.items():
            paths[name] = os.path.join(d, name)
            with open(paths[name], "w") as f:
                f.write(content if isinstance(content, str) else json.dumps(content))
        p = lambda name: os.path.join(d, name)  # noqa: E731 (absent files: the summary reports them)
        args = {"out": p("gpu_check.json"), "tests-json": p("gpu_tests.json"), "tests-status": "passed", "tests-s": "25",
                "train-status": "passed (30 s)", "bench-json": p("bench.json"), "bench-status": "passed",
                "parity-status": "passed: ok", "parity-bf16-status": "passed: ok", "attn-json": p("attention_bench.json"),
                "attn-status": "passed", "pointwise-txt": p("pointwise_bench.txt"), "dist-status": p("gpu_dist_status.txt"),
                "cand-json": p("gpu_tests_candidates.json"), "cand-status": "skipped", "cand-s": "0",
                "gemm-json": p("gemm_bench.json"), "gemm-status": "passed", "torch-gemm-json": p("torch_gemm_bench.json"),
                "torch-gemm-status": "passed"}
        args.update({k.replace("_", "-"): v for k, v in status.items()})
        cmd = [sys.executable, SUMMARY] + [x for k, v in args.items() for x in ("--" + k, v)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        with open(p("gpu_check.json")) as f:
            return r.returncode, json.load(f), r

    def test_gemm_vs_torch_ratios(self):
        ours = gemm_json([("attn.c_attn forward", 0.30), ("mlp.c_proj dx (dgelu)", 0.50), ("lm_head dW", -1)], 30.0)
        torch = gemm_json([("attn.c_attn forward", 0.20), ("mlp.c_proj dx (dgelu)", 0.50), ("lm_head dW", 1.0),
                           ("only.in_torch", 0.1)], 24.0, bench="torch_gemm_shapes", engine="torch", torch="2.11.0",
                          cuda="13.0", libraries=["/site/nvidia/cublas/lib/libcublasLt.so.13"])
        with tempfile.TemporaryDirectory() as d:
            rc, s, r = self.run_summary(d, {"gemm_bench.json": ours, "torch_gemm_bench.json": torch})
        self.assertEqual(rc, 1, r.stderr)  # the tests' reports are absent: not ok, but the summary is written
        g = s["gemm_vs_torch"]
        self.assertEqual(g["status"], "passed")
        self.assertEqual(g["gemms"], {"attn.c_attn forward": 1.5, "mlp.c_proj dx (dgelu)": 1.0})
        self.assertEqual(g["not_compared"], ["lm_head dW", "only.in_torch"])  # ours declined it; torch's alone
        self.assertEqual(g["step_gemm"], 1.25)
        self.assertEqual((g["torch"], g["cuda"], g["torch_step_gemm_ms"]), ("2.11.0", "13.0", 24.0))
        self.assertEqual(g["torch_libraries"], ["/site/nvidia/cublas/lib/libcublasLt.so.13"])
        self.assertIn("above 1, ours is slower", g["meaning"])
        self.assertEqual(s["gemm_bench"]["step_gemm_ms"], 30.0)  # the existing headline is still there
        self.assertIn("no gtest report", s["tests"]["report"])

    def test_skipped_missing_and_mismatched_torch_benches(self):
        ours = gemm_json([("attn.c_attn forward", 0.30)], 3.6)
        with tempfile.TemporaryDirectory() as d:
            skipped = {"bench": "torch_gemm_shapes", "engine": "torch", "skipped": "python3 cannot import torch"}
            _, s, _ = self.run_summary(d, {"gemm_bench.json": ours, "torch_gemm_bench.json": skipped},
                                       torch_gemm_status="failed (exit 3)")
            self.assertEqual(s["gemm_vs_torch"], {"status": "skipped: python3 cannot import torch"})
        with tempfile.TemporaryDirectory() as d:
            _, s, _ = self.run_summary(d, {"gemm_bench.json": ours}, torch_gemm_status="timed out after 20 s")
            self.assertEqual(s["gemm_vs_torch"]["status"], "timed out after 20 s")
            self.assertIn("no JSON from torch_gemm_shapes.py", s["gemm_vs_torch"]["report"])
        with tempfile.TemporaryDirectory() as d:
            torch = gemm_json([("attn.c_attn forward", 0.30)], 3.6, rows=4096)
            _, s, _ = self.run_summary(d, {"gemm_bench.json": ours, "torch_gemm_bench.json": torch})
            self.assertIn("different shapes", s["gemm_vs_torch"]["report"])
            self.assertNotIn("gemms", s["gemm_vs_torch"])
        with tempfile.TemporaryDirectory() as d:
            torch = gemm_json([("attn.c_attn forward", 0.30)], 3.6)
            _, s, _ = self.run_summary(d, {"torch_gemm_bench.json": torch}, gemm_status="failed (exit 1)")
            self.assertIn("no JSON from bench_cuda_gemm", s["gemm_vs_torch"]["report"])

    def test_ok_when_every_established_check_passed(self):
        gtest = {"testsuites": [{"testsuite": [{"classname": "Gpu", "name": "Runs", "result": "COMPLETED"}]}], "crashed": []}
        files = {"gpu_tests.json": gtest, "gpu_dist_status.txt": "nccl_world1: passed (2 s)\n",
                 "bench.json": {"throughput": 1.0}, "attention_bench.json": {"tflops": 1.0},
                 "pointwise_bench.txt": "a table\n{\"bench\": \"pointwise\"}\n"}
        with tempfile.TemporaryDirectory() as d:
            rc, s, r = self.run_summary(d, files)
            self.assertEqual(rc, 0, r.stdout + r.stderr)
            self.assertTrue(s["ok"])
            self.assertEqual(s["tests"]["total"], 1)
            self.assertEqual(s["pointwise_bench"], {"bench": "pointwise"})
            self.assertEqual(s["gpu_dist"], {"nccl_world1": "passed (2 s)"})
            # the torch GEMM bench is reported, never part of ok
            self.assertIn("report", s["gemm_vs_torch"])
            rc, s, _ = self.run_summary(d, files, parity_status="failed: 2e-3")
            self.assertEqual((rc, s["ok"]), (1, False))


class Scripts(unittest.TestCase):
    def test_gpu_check_calls_the_summary_with_its_options(self):
        sh = read(CHECK_SH)
        call = re.search(r'python3 "\$ROOT/scripts/gpu_check_summary.py"(.*?)\n\s*\n', sh + "\n\n", re.S)
        self.assertIsNotNone(call)
        given = set(re.findall(r"--([a-z0-9-]+) ", call.group(1)))
        spec = importlib.util.spec_from_file_location("gpu_check_summary", SUMMARY)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        self.assertEqual(given, set(mod.OPTIONS))

    def test_the_pack_carries_the_bench_scripts_and_their_imports(self):
        sh = read(CHECK_SH)
        packed = set(re.findall(r'"\$ROOT"/bench/(\w+\.py)', sh))
        self.assertTrue({"compare_pytorch_gpu.py", "torch_gemm_shapes.py", "torch_profile.py"} <= packed, packed)
        for script in sorted(packed):  # every module of bench/ a packed script imports is packed too
            for mod in re.findall(r"^\s*(?:from (\w+) import|import (\w+))", read(os.path.join(ROOT, "bench", script)), re.M):
                name = (mod[0] or mod[1]) + ".py"
                if os.path.exists(os.path.join(ROOT, "bench", name)):
                    self.assertIn(name, packed, f"{script} imports {name}")
        self.assertIn('"$ROOT/scripts/gpu_check_summary.py"', sh)
        run_step = sh[sh.index("cmd_run() {"):sh.index("cmd_all() {")]
        self.assertTrue("torch_gemm_status=$(run_torch_gemm " in run_step, "cmd_run runs no run_torch_gemm")
        fn = sh[sh.index("run_torch_gemm() {"):sh.index("cmd_run() {")]
        self.assertEqual(fn.count("python3 bench/torch_gemm_shapes.py --max-seconds 5"), 2)

    def run_torch_gemm(self, given, answer):
        """gpu_check.sh's run_torch_gemm with a fake python3 that logs the LD_LIBRARY_PATH it got and
        prints `answer` (exit 3 when it is a skipped line); the pack's path is /pack/lib."""
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "bin"))
            fake = os.path.join(d, "bin", "python3")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\n"
                        f"echo \"LD=${{LD_LIBRARY_PATH-unset}} $*\" >>{d}/calls\n"
                        f"echo '{json.dumps(answer)}'\n"
                        f"exit {3 if 'skipped' in answer else 0}\n")
            os.chmod(fake, 0o755)
            r = subprocess.run(["bash", "-c", f'source "{CHECK_SH}"; export LD_LIBRARY_PATH=/pack/lib; '
                                f'run_torch_gemm "{d}/out.json" "{d}/log"'],
                               capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, PATH=os.path.join(d, "bin") + ":" + os.environ["PATH"],
                                        ATHANOR_GIVEN_LD_LIBRARY_PATH=given))
            with open(os.path.join(d, "calls")) as f:
                return r.stdout.strip(), [ln.split()[0] for ln in f], r

    def test_run_torch_gemm_uses_the_machines_environment_then_the_packs(self):
        ok = {"bench": "torch_gemm_shapes", "gemms": []}
        status, calls, r = self.run_torch_gemm("/machine/lib", ok)
        self.assertEqual((status, calls), ("passed", ["LD=/machine/lib"]), r.stderr)
        status, calls, _ = self.run_torch_gemm("", ok)
        self.assertEqual(calls, ["LD=unset"])  # the pack's path left out
        no_cuda = {"skipped": "--device cuda but torch 2.11.0 sees no CUDA device"}
        status, calls, _ = self.run_torch_gemm("", no_cuda)
        self.assertEqual((status, calls), ("failed (exit 3)", ["LD=unset", "LD=/pack/lib"]))
        status, calls, _ = self.run_torch_gemm("", {"skipped": "python3 cannot import torch"})
        self.assertEqual((status, calls), ("failed (exit 3)", ["LD=unset"]))  # no torch: no second try

    def test_gpu_bench_profiles_the_first_config(self):
        sh = read(BENCH_SH)
        self.assertIn("--torch-profile-steps 3 --torch-profile-configs gpt2-124m-gpu", sh)
        h = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "compare_pytorch_gpu.py"), "--help"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(h.returncode, 0, h.stderr)
        self.assertIn("--torch-profile-steps", h.stdout)
        self.assertIn("--torch-profile-configs", h.stdout)


if __name__ == "__main__":
    unittest.main()
