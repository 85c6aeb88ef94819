"""bench/compare_pytorch_gpu.py and the GPU bench configs, checked without a GPU (issue 22).

    python3 tests/bench/test_compare_pytorch_gpu.py ATHANOR_CLI

- the three bench/configs/gpt2-*-gpu*.yaml pass athanor's config validation and build their
  model plan (`athanor plan --evaluate`) at every micro-batch the bench tries, and hold what the
  issue fixes (vocab 50304, T 1024, bf16, AdamW, clip 1.0, the 350M shape, checkpointing);
- the script's YAML reader (the GPU machine's Python has no PyYAML) reads them as PyYAML does;
- the table and its statistics on a fixed set of results (medians, spreads, paired ratios, MFU,
  memory, a config that failed);
- the CPU smoke path: both engines, 2 repeats of 2 steps on a tiny model, eager PyTorch, and
  --torch-profile-steps after them (skipped, saying so, where this Python has no torch).
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "compare_pytorch_gpu.py")
CLI = None  # set from argv

spec = importlib.util.spec_from_file_location("compare_pytorch_gpu", SCRIPT)
cpg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpg)

CONFIGS = ["gpt2-124m-gpu", "gpt2-350m-gpu", "gpt2-124m-gpu-ckpt"]


def config_path(name):
    return os.path.join(ROOT, "bench", "configs", name + ".yaml")


class Configs(unittest.TestCase):
    def test_configs_pass_validation_and_plan_at_every_batch(self):
        for name in CONFIGS:
            for b in (16, 32, 64):
                p = subprocess.run([CLI, "plan", config_path(name), f"trainer.batch_size={b}", "--cluster", "h100-sxm-80gb",
                                    "--evaluate", "--world", "1", "--json"], capture_output=True, text=True, timeout=120)
                self.assertEqual(p.returncode, 0, f"{name} B={b}: {p.stderr}")
                plan = json.loads(p.stdout)
                self.assertIn(f"mb {b} ", plan["layout"] + " ", f"{name}: {plan['layout']}")
                self.assertEqual(plan["rejected"], "", f"{name} B={b}: {plan['rejected']}")
                self.assertEqual("recompute" in plan["layout"], name.endswith("ckpt"), plan["layout"])

    def test_validation_is_real_an_unknown_key_fails(self):
        p = subprocess.run([CLI, "plan", config_path(CONFIGS[0]), "trainer.batch_sise=16", "--cluster", "h100-sxm-80gb",
                            "--evaluate", "--world", "1", "--json"], capture_output=True, text=True, timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("unknown key 'trainer.batch_sise'", p.stderr)

    def test_configs_hold_the_issues_workloads(self):
        for name in CONFIGS:
            c = cpg.load_config(config_path(name))
            m, t, o = c["model"], c["trainer"], c["optimizer"]
            self.assertEqual((m["vocab_size"], m["block_size"], t["precision"], t["device"]), (50304, 1024, "bf16", "cuda"), name)
            self.assertEqual((o["type"], o["grad_clip"], t["accum_steps"]), ("adamw", 1.0, 1), name)
            shape = (m["n_layer"], m["n_embd"], m["n_head"])
            self.assertEqual(shape, (24, 1024, 16) if "350m" in name else (12, 768, 12), name)
            self.assertEqual(bool(m.get("gradient_checkpointing", False)), name.endswith("ckpt"), name)

    def test_the_scripts_yaml_reader_agrees_with_pyyaml(self):
        try:
            import yaml
        except ImportError:
            self.skipTest("no PyYAML in this Python to compare with")
        folder = os.path.join(ROOT, "bench", "configs")
        for f in sorted(os.listdir(folder)):
            if not f.endswith(".yaml"):
                continue
            with open(os.path.join(folder, f)) as fh:
                text = fh.read()
            real = yaml.safe_load(text)
            # the fallback reader itself, PyYAML hidden
            saved = sys.modules.get("yaml")
            sys.modules["yaml"] = None
            try:
                mine = cpg.parse_yaml(text, f)
            finally:
                sys.modules["yaml"] = saved
            self.assertEqual(mine, real, f)


def fake_run(engine, tput, ms, peak, flops=6.0e12, params=124_475_904):
    return {"engine": engine, "throughput": tput, "median_ms": ms, "flops_per_step": flops, "parameters": params,
            "targets_per_step": 16 * 1024, "peak_bytes": {"total": peak}}


class Table(unittest.TestCase):
    def results(self):
        # Three paired repeats; athanor 100/120/110 k tok/s, torch 100/100/125 (ratios 1.0, 1.2, 0.88).
        reps = [{"athanor": fake_run("athanor", 100e3, 150.0, 30 * 2**30), "torch": fake_run("torch.compile", 100e3, 160.0, 20 * 2**30)},
                {"athanor": fake_run("athanor", 120e3, 130.0, 31 * 2**30), "torch": fake_run("torch.compile", 100e3, 163.84, 20 * 2**30)},
                {"athanor": fake_run("athanor", 110e3, 140.0, 30 * 2**30), "torch": fake_run("torch.compile", 125e3, 131.072, 21 * 2**30)}]
        return {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "steps": 20, "warmup": 5, "repeats": 3,
                "configs": [{"config": "gpt2-124m-gpu", "batch": 16, "repeats": reps, "torch_compile_s": 41.6,
                             "torch_compiled": True, "torch_version": "2.11.0"},
                            {"config": "gpt2-350m-gpu", "repeats": [], "error": "athanor: no batch fits"}]}

    def test_row_statistics(self):
        t = cpg.table(self.results(), 989.0)
        row = [ln for ln in t.splitlines() if ln.startswith("| gpt2-124m-gpu ")][0]
        cells = [c.strip() for c in row.strip("|").split("|")]
        self.assertEqual(cells[1], "NVIDIA H100 80GB HBM3")
        self.assertEqual(cells[2], "16 × 1024")
        self.assertEqual(cells[3], "2.11.0 torch.compile")
        self.assertEqual(cells[4], "110,000 [100,000–120,000]")
        self.assertEqual(cells[5], "100,000 [100,000–125,000]")
        self.assertEqual(cells[6], "1.00× [0.88–1.20]")  # paired per repeat: median of 1.0, 1.2, 0.88
        self.assertEqual(cells[7], "140.0 / 160.0")
        # MFU: 6e12 FLOP / 0.140 s / 989e12 = 4.33%; torch at its median 160 ms: 3.79%
        self.assertEqual(cells[8], "4.3% / 3.8%")
        self.assertEqual(cells[9], "31.0 / 21.0")  # the peak over the repeats
        self.assertEqual(cells[10], "42")
        self.assertIn("989 TFLOP/s", t)

    def test_a_failed_config_is_a_row_saying_why(self):
        t = cpg.table(self.results())
        self.assertIn("| gpt2-350m-gpu | NVIDIA H100 80GB HBM3 | — | not measured: athanor: no batch fits", t)

    def test_different_models_are_flagged(self):
        r = self.results()
        r["configs"][0]["repeats"][1]["torch"]["parameters"] += 1
        self.assertIn("the engines' models differ", cpg.table(r))

    def test_table_from_a_saved_out_file(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(self.results(), f)
        try:
            p = subprocess.run([sys.executable, SCRIPT, "--table", f.name], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stdout.strip(), cpg.table(self.results()).strip())
        finally:
            os.unlink(f.name)


def require_torch(test):
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    if probe.returncode != 0:
        test.skipTest(f"{sys.executable} has no torch (Debian's python3-torch is for /usr/bin/python3)")


class CpuSmoke(unittest.TestCase):
    def test_the_batch_is_the_largest_both_engines_fit(self):
        require_torch(self)
        with tempfile.TemporaryDirectory() as d:
            # athanor "runs out of memory" above batch 2 (a wrapper saying what the device
            # allocator says), PyTorch above batch 1: both must run at 1.
            wrapper = os.path.join(d, "athanor")
            with open(wrapper, "w") as f:
                f.write("#!/bin/sh\n"
                        "for a in \"$@\"; do case \"$a\" in trainer.batch_size=[3-9]*|trainer.batch_size=[1-9][0-9]*)\n"
                        "  echo 'athanor::Error in cuda allocator: cuda:0 out of memory: a request of 1 GiB' >&2; exit 1;; esac; done\n"
                        f"exec {CLI} \"$@\"\n")
            os.chmod(wrapper, 0o755)
            out = os.path.join(d, "r.json")
            p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--batches", "4", "2", "1", "--repeats", "1",
                                "--steps", "2", "--warmup", "1", "--athanor", wrapper, "--out", out],
                               capture_output=True, text=True, timeout=240,
                               env=dict(os.environ, OMP_NUM_THREADS="2", COMPARE_GPU_TEST_OOM_ABOVE="1"))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(out) as fh:
                rec = json.load(fh)["configs"][0]
        self.assertEqual([t["batch"] for t in rec["athanor_probe"]], [4])  # 4 failed, 2 ran
        self.assertEqual([(e["batch"], e["fits"]) for e in rec["torch_probe"]], [(2, False), (1, True)])
        self.assertEqual(rec["batch"], 1)
        self.assertEqual(rec["repeats"][0]["athanor"]["targets_per_step"], 32)
        self.assertEqual(rec["repeats"][0]["torch"]["targets_per_step"], 32)

    def test_both_engines_run_two_paired_repeats_on_the_cpu(self):
        require_torch(self)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.json")
            p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--batches", "4", "2", "--repeats", "2",
                                "--steps", "2", "--warmup", "1", "--athanor", CLI, "--out", out],
                               capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="2"))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(out) as fh:
                res = json.load(fh)
        rec = res["configs"][0]
        self.assertEqual(rec["batch"], 4)  # the largest that fits (everything fits on the CPU)
        self.assertFalse(rec["torch_compiled"])
        self.assertEqual(len(rec["repeats"]), 2)
        for pair in rec["repeats"]:
            a, t = pair["athanor"], pair["torch"]
            self.assertEqual(a["parameters"], t["parameters"])  # the same model, counted by each engine
            self.assertAlmostEqual(a["flops_per_step"], t["flops_per_step"], delta=1e-6 * t["flops_per_step"])
            self.assertEqual((a["steps"], t["steps"]), (2, 2))
            self.assertEqual(a["targets_per_step"], t["targets_per_step"])
            for r in (a, t):  # GPT-2's init: every logit near 0, so the loss starts near ln(vocab)
                self.assertLess(abs(r["final_loss"] - math.log(512)), 0.3, r)
        self.assertIn("| gpt2-124m-gpu | cpu | 4 × 32 |", p.stdout)

    def test_the_torch_profile_of_a_config(self):
        require_torch(self)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.json")
            p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--batches", "2", "--repeats", "1",
                                "--steps", "2", "--warmup", "1", "--athanor", CLI, "--out", out, "--torch-profile-steps", "2",
                                "--torch-profile-configs", "gpt2-124m-gpu"],
                               capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="2"))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(out) as fh:
                rec = json.load(fh)["configs"][0]
        prof = rec["torch_profile"]
        self.assertNotIn("error", prof)
        self.assertEqual((prof["steps"], prof["batch"]), (2, 2))
        self.assertGreater(prof["device_ms_per_step"], 0)
        self.assertGreater(prof["categories"]["gemm"]["ms_per_step"], 0)  # the CPU's aten::mm / addmm
        self.assertTrue(0 < len(prof["top_kernels"]) <= 15)
        self.assertLess(prof["wall_s"], rec["wall_s"])
        self.assertEqual(len(rec["repeats"]), 1)  # the profile runs after the timed repeats, never in them
        self.assertIn("PyTorch eager's step on the device, gpt2-124m-gpu (batch 2, 2 profiled steps", p.stdout)
        self.assertIn("| gemm |", p.stdout)


if __name__ == "__main__":
    CLI = os.path.abspath(sys.argv.pop(1))
    unittest.main()
