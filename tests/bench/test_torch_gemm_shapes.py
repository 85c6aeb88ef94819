"""bench/torch_gemm_shapes.py, checked without a GPU (issue 22): the GEMMs it times are
bench/cuda_gemm.cpp's (its linears table read from the C++ source, names, shapes, counts and
in_step flags), its output keys include bench_cuda_gemm's, its CPU dry run, its "skipped" line
without torch, its argument errors.

    python3 tests/bench/test_torch_gemm_shapes.py
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import types
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "torch_gemm_shapes.py")
CPP = os.path.join(ROOT, "bench", "cuda_gemm.cpp")

spec = importlib.util.spec_from_file_location("torch_gemm_shapes", SCRIPT)
tgs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tgs)


def opts(rows=7, d=2, layers=3, vocab=5):
    return types.SimpleNamespace(rows=rows, d=d, layers=layers, vocab=vocab)


def has_torch():
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


class SameGemmsAsTheCpp(unittest.TestCase):
    def test_the_linears_table_is_the_cpps(self):
        with open(CPP) as f:
            src = f.read()
        rows = re.findall(r'\{"([\w.]+)", ([^,{}]+), ([^,{}]+), ([^,{}]+), (true|false), (true|false)\}', src)
        self.assertEqual(len(rows), 5, rows)
        o = opts(d=768, layers=12, vocab=50304)
        env = {"D": o.d, "L": o.layers, "o": types.SimpleNamespace(vocab=o.vocab)}
        cpp = [(n, eval(out, {}, env), eval(inp, {}, env), eval(ps, {}, env), b == "true", g == "true")
               for n, out, inp, ps, b, g in rows]
        self.assertEqual(cpp, tgs.linears(o))

    def test_names_shapes_counts_and_in_step(self):
        # By hand from bench/cuda_gemm.cpp's loop: forward (bias epilogue) [+ ", no epilogue"],
        # [dx (dgelu)], dx, [dW (bias_grad)], dW; forward m=rows n=out k=in, dx m=rows n=in k=out,
        # dW m=out n=in k=rows; in_step: the variant the step runs.
        M, D, L, V = 7, 2, 3, 5
        want = []
        for name, out, inp, dgelu in (("attn.c_attn", 3 * D, D, False), ("attn.c_proj", D, D, False),
                                      ("mlp.c_fc", 4 * D, D, False), ("mlp.c_proj", D, 4 * D, True)):
            want += [(f"{name} forward", M, out, inp, L, True), (f"{name} forward, no epilogue", M, out, inp, L, False)]
            if dgelu:
                want.append((f"{name} dx (dgelu)", M, inp, out, L, True))
            want += [(f"{name} dx", M, inp, out, L, not dgelu), (f"{name} dW (bias_grad)", out, inp, M, L, True),
                     (f"{name} dW", out, inp, M, L, False)]
        want += [("lm_head forward", M, V, D, 1, True), ("lm_head dx", M, D, V, 1, True), ("lm_head dW", V, D, M, 1, True)]
        got = [(r["gemm"], r["m"], r["n"], r["k"], r["per_step"], r["in_step"]) for r in tgs.gemm_table(opts(M, D, L, V))]
        self.assertEqual(got, want)
        self.assertEqual({r["op"] for r in tgs.gemm_table(opts())}, set(tgs.TORCH_OPS))

    def test_the_cpp_names_its_gemms_the_same_way(self):
        with open(CPP) as f:
            src = f.read()
        for suffix in (" forward", " forward, no epilogue", " dx (dgelu)", " dx", " dW (bias_grad)", " dW"):
            self.assertIn(f'n + "{suffix}"', src)


class Cli(unittest.TestCase):
    def test_bad_arguments_say_what(self):
        p = subprocess.run([sys.executable, SCRIPT, "--rows", "0"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("sizes and --iters must be positive", p.stderr)
        p = subprocess.run([sys.executable, SCRIPT, "--device", "tpu"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--device tpu", p.stderr)

    def test_without_torch_a_skipped_line_and_exit_3(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "torch.py"), "w") as f:
                f.write("raise ImportError('no torch in this test')\n")
            p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu"], capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, PYTHONPATH=d))
        self.assertEqual(p.returncode, 3, p.stderr)
        out = json.loads(p.stdout)
        self.assertEqual((out["bench"], out["engine"]), ("torch_gemm_shapes", "torch"))
        self.assertIn("no torch in this test", out["skipped"])

    def test_cpu_dry_run(self):
        if not has_torch():
            self.skipTest(f"{sys.executable} has no torch (Debian's python3-torch is for /usr/bin/python3)")
        p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--rows", "64", "--d", "32", "--layers", "2",
                            "--vocab", "96", "--iters", "3"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        self.assertEqual(len(lines), 1)
        out = json.loads(lines[0])
        self.assertIn("timings mean nothing", out["dry_run"])
        self.assertEqual((out["engine"], out["gpu"], out["rows"], out["d"], out["layers"], out["vocab"], out["dtype"]),
                         ("torch", "cpu", 64, 32, 2, 96, "bf16"))
        self.assertEqual([g["gemm"] for g in out["gemms"]], [r["gemm"] for r in tgs.gemm_table(opts(64, 32, 2, 96))])
        for g in out["gemms"]:
            self.assertGreater(g["ms"], 0, g)
            self.assertEqual(g["iters"], 3)
            self.assertLessEqual(g["min_ms"], g["ms"])
            self.assertLessEqual(g["ms"], g["max_ms"])
            self.assertEqual("separate_ms" in g, "(dgelu)" in g["gemm"] or "(bias_grad)" in g["gemm"], g["gemm"])
        step = sum(g["ms"] * g["per_step"] for g in out["gemms"] if g["in_step"])
        self.assertAlmostEqual(out["step_gemm_ms"], step, delta=1e-3 + 1e-3 * step)
        # every key bench_cuda_gemm prints (its printf formats), top level and per GEMM
        with open(CPP) as f:
            cpp_keys = set(re.findall(r'\\"(\w+)\\": ', f.read()))
        self.assertTrue({"gemm", "m", "ms", "tflops", "step_gemm_ms", "gemms", "rows"} <= cpp_keys, cpp_keys)
        mine = set(out) | set(out["gemms"][0])
        self.assertEqual(cpp_keys - mine - {"bench"}, set())
        self.assertEqual(out["bench"], "torch_gemm_shapes")


if __name__ == "__main__":
    unittest.main()
