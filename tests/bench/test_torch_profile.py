"""bench/torch_profile.py, checked without a GPU (issue 22): the kernel categories of
torch.compile's step over real kernel names, the per-step sums and the top kernels, the Markdown
tables, and their place in bench/compare_pytorch_gpu.py's output.

    python3 tests/bench/test_torch_profile.py
"""
import importlib.util
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tp = load("torch_profile")

# Kernel names as profilers print them, from PyTorch's, cuBLAS's, FlashAttention's and Inductor's
# naming (as they appear in published torch.profiler / nsys tables), each with the category it
# must land in. The comments say why a name is a trap for a naive rule.
REAL_NAMES = [
    # cuBLAS / cuBLASLt on Hopper: the xmma and the (cuBLAS 12.8+) nvjet families, split-K's reduction
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "gemm"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("nvjet_tst_64x64_64x8_2x1_v_bz_splitK_TNT", "gemm"),
    ("nvjet_hsh_256x128_64x4_2x1_v_bz_TNN", "gemm"),
    ("splitKreduce_kernel", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
     "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)", "gemm"),
    ("void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 2, 2, false, false, "
     "cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float>, float> >", "gemm"),
    # Inductor's Triton matmul templates (max-autotune): tem + an mm among the origin ops
    ("triton_tem_fused_addmm_native_layer_norm_view_1", "gemm"),
    ("triton_tem_fused__unsafe_view_gelu_mm_mul_t_view_28", "gemm"),
    # FlashAttention in PyTorch: its template arguments name cutlass types (not a GEMM)
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, "
     "Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, false, false>"
     "(pytorch_flash::Flash_fwd_params)", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 2, 2, "
     "false, false, cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 8, cutlass::bfloat16_t> >, false, true, false, "
     "false, false, true, false>(pytorch_flash::Flash_bwd_params)", "attention"),
    ("void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 2, 2, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params)",
     "attention"),
    ("void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 2, 2, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params, int)",
     "attention"),
    # memory-efficient SDPA (cutlass inside) and cuDNN's SDPA (wgmma inside)
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
     "cutlass::arch::Sm80, true, 64, 128, 64, true, true>::Params)", "attention"),
    ("fmha_cutlassB_bf16_aligned_128x128_k128_sm80", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x1x1_kernel0_0", "attention"),
    # Inductor's fusions: pointwise / reduction / persistent; named after their origin aten ops,
    # which may be a GEMM's bias add or the layout copies around SDPA: still Triton kernels
    ("triton_poi_fused__scaled_dot_product_flash_attention_add_mul_permute_stack_sub_unbind_view", "triton"),
    ("triton_per_fused_addmm_mean_relu_sub_1", "triton"),
    ("triton_poi_fused_arange_ge_index_put_lift_fresh_0", "triton"),
    # the cross-entropy, fused by Inductor and in eager
    ("triton_red_fused__log_softmax_backward_data_nll_loss_backward_nll_loss_forward_1", "cross_entropy"),
    ("triton_red_fused__log_softmax__to_copy_12", "cross_entropy"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, "
     "float const*, long const*, float const*, bool, long, long, long, long)", "cross_entropy"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, c10::Half, "
     "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(c10::Half*, c10::Half const*, int)", "cross_entropy"),
    # fused AdamW and clip_grad_norm_'s foreach norm (multi_tensor_apply) and its second pass
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
     "(at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, float*, float*>", "optimizer"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, "
     "at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>"
     "(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor"
     "<float, 2, 2, 0>, std::plus<float>, float)", "optimizer"),
    ("void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float, float>(float const*, "
     "at::native::TensorListAddresses, int)", "optimizer"),
    # the profiler's copy records
    ("Memcpy HtoD (Pageable -> Device)", "memcpy_memset"),
    ("Memcpy DtoD (Device -> Device)", "memcpy_memset"),
    ("Memset (Device)", "memcpy_memset"),
    # known to be none of the above, or not knowable from the name: "other"
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >"
     "(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)", "other"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
     "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
     "unsigned int, float, 4> >", "other"),
    ("index_elementwise_kernel", "other"),
    ("ncclDevKernel_AllGather_RING_LL", "other"),
    # a log-softmax only by its template flag: the name does not say it, so no guess
    ("void at::native::(anonymous namespace)::softmax_warp_forward<float, float, float, 4, true, false>(float*, "
     "float const*, int, int, int, bool const*, int, bool)", "other"),
    ("some_kernel_nobody_knows", "other"),
]


class Categories(unittest.TestCase):
    def test_real_kernel_names(self):
        wrong = [(n[:80], tp.kernel_category(n), want) for n, want in REAL_NAMES if tp.kernel_category(n) != want]
        self.assertEqual(wrong, [])

    def test_every_category_is_reached_and_known(self):
        self.assertEqual({c for _, c in REAL_NAMES}, set(tp.CATEGORIES))

    def test_the_cpu_dry_runs_aten_ops(self):
        self.assertEqual(tp.kernel_category("aten::mm"), "gemm")
        self.assertEqual(tp.kernel_category("aten::addmm"), "gemm")
        self.assertEqual(tp.kernel_category("aten::nll_loss_backward"), "cross_entropy")
        self.assertEqual(tp.kernel_category("aten::mm_backward_helper"), "other")  # whole names only
        self.assertEqual(tp.kernel_category("aten::native_layer_norm"), "other")


class Summary(unittest.TestCase):
    EVENTS = [("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 3000.0, 1), ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 3000.0, 1),
              ("triton_poi_fused_add_0", 500.0, 1), ("Memset (Device)", 100.0, 1), ("mystery", 400.0, 1),
              ("void pytorch_flash::flash_fwd_kernel<x>", 2000.0, 1)]

    def test_per_step_sums_shares_and_top(self):
        s = tp.summarize(self.EVENTS, 2)
        self.assertEqual(s["steps"], 2)
        self.assertAlmostEqual(s["device_ms_per_step"], 4.5)  # 9000 us over 2 steps
        c = s["categories"]
        self.assertAlmostEqual(c["gemm"]["ms_per_step"], 3.0)
        self.assertEqual(c["gemm"]["kernels"], 1)  # one distinct name, 2 calls
        self.assertAlmostEqual(c["gemm"]["share"], 6000 / 9000, places=4)
        self.assertAlmostEqual(c["attention"]["ms_per_step"], 1.0)
        self.assertAlmostEqual(c["other"]["ms_per_step"], 0.2)
        self.assertAlmostEqual(c["memcpy_memset"]["ms_per_step"], 0.05)
        self.assertAlmostEqual(sum(v["share"] for v in c.values()), 1.0, places=3)
        self.assertEqual(set(c), set(tp.CATEGORIES))
        top = s["top_kernels"]
        self.assertEqual([k["category"] for k in top], ["gemm", "attention", "triton", "other", "memcpy_memset"])
        self.assertEqual(top[0]["calls_per_step"], 1)
        self.assertAlmostEqual(top[0]["ms_per_step"], 3.0)
        self.assertEqual(len(tp.summarize(self.EVENTS, 2, top=2)["top_kernels"]), 2)

    def test_bad_steps_and_empty(self):
        with self.assertRaises(ValueError):
            tp.summarize(self.EVENTS, 0)
        s = tp.summarize([], 3)
        self.assertEqual((s["device_ms_per_step"], s["top_kernels"]), (0.0, []))

    def test_markdown_tables(self):
        s = tp.summarize(self.EVENTS + [("a|b " + "x" * 200, 1.0, 1)], 2)
        s.update(step_ms=5.0, batch=64, device="NVIDIA H200")
        lines = tp.markdown("gpt2-124m-gpu", s)
        self.assertIn("4.5 ms of device time per step against 5.0 ms wall", lines[0])
        self.assertIn("batch 64, 2 profiled steps, NVIDIA H200", lines[0])
        rows = [ln for ln in lines if ln.startswith("| ") and "|---" not in ln]
        self.assertEqual(rows[1], "| gemm | 3.00 | 66.7% | 1 |")  # sorted by time, after the header
        self.assertIn("| `nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT` | gemm | 3.000 | 1 |", lines)
        self.assertIn("| `pytorch_flash::flash_fwd_kernel<x>` | attention | 1.000 | 0.5 |", lines)  # 'void ' cut
        long_row = [ln for ln in lines if "a\\|b" in ln][0]  # '|' escaped, the name cut to 90
        self.assertIn("…", long_row)


class CompareTable(unittest.TestCase):
    def test_profile_tables_follow_the_main_table(self):
        cpg = load("compare_pytorch_gpu")
        prof = tp.summarize(Summary.EVENTS, 2)
        prof.update(step_ms=5.0, batch=64, device="NVIDIA H200", wall_s=3.0)
        res = {"device": "cuda", "device_name": "NVIDIA H200", "steps": 20, "warmup": 3, "repeats": 2,
               "configs": [{"config": "gpt2-124m-gpu", "repeats": [], "error": "athanor: no batch fits",
                            "torch_compiled": True, "torch_profile": prof},
                           {"config": "gpt2-350m-gpu", "repeats": [], "torch_profile": {"skipped": "budget: 12 s left"}}]}
        t = cpg.table(res)
        self.assertIn("torch.compile's step on the device, gpt2-124m-gpu (batch 64, 2 profiled steps, NVIDIA H200)", t)
        self.assertIn("| gemm | 3.00 | 66.7% | 1 |", t)
        self.assertIn("gpt2-350m-gpu: not profiled (budget: 12 s left)", t)
        self.assertLess(t.index("| gpt2-350m-gpu |"), t.index("torch.compile's step"))  # after the main table


if __name__ == "__main__":
    unittest.main()
