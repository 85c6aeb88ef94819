// CUDA flash attention (src/backend/cuda/attention.h): forward, backward and both, timed with
// CUDA events on the compute stream, at GPT-2-124M's shape by default (B 16, H 12, T 1024,
// D 64, causal, bf16, packed qkv). Prints one JSON line (ms per call and TFLOP/s).
//
// FLOPs by the usual convention (FlashAttention's papers): forward 4 B H Tq Tk D, halved when
// causal; backward 2.5x the forward (5 products against 2), not counting the products this
// kernel recomputes for its deterministic dQ pass. So the figures compare with others'.
//
// Both implementations (src/backend/cuda/attention_fast.h) are timed by default, one JSON key
// each ("reference", "fast"; ATHANOR_CUDA_ATTENTION is ignored here). Where the fast kernels
// do not take the shape (f32, D not 64/128) the "fast" entry says "fallback": true (it then
// times the reference kernels again).
//
// "cudnn": cuDNN's fused attention (candidate attention_cudnn, src/backend/cuda/attention_cudnn.h),
// timed through attention_forward/backward with the candidate on; {"available": false,
// "reason": ...} where cuDNN is missing, declines the shape or builds no plan for it.
//
// --tiles picks the fast kernels' tile configuration (attention_fast.h's names, as
// ATHANOR_CUDA_ATTENTION_TILES, which is ignored here): "<forward>,<backward>" runs the "fast"
// entry in it; "all" also times the forward and the backward of every configuration, alone, in
// a "tiles" object ({"fwd": {name: {...}}, "bwd": {name: {...}}}), so one run ranks them (a
// configuration without kernels at this D says "instantiated": false: it runs the default's).
//
//   bench_cuda_attention [--B 16] [--H 12] [--Hkv H] [--T 1024] [--D 64] [--dtype bf16|f16|f32]
//                        [--noncausal] [--contiguous] [--iters 20] [--max-seconds 10]
//                        [--impl both|reference|fast|cudnn] (both: all three)
//                        [--tiles default|all|<forward>,<backward>]
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "athanor/core/dtype.h"
#include "athanor/core/error.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/attention_fast.h"
#include "backend/cuda/candidates.h"
#include "backend/cuda/runtime.h"
#include "cuda_bench.h"

using namespace athanor;
using athanor::bench::device_alloc;

namespace {

struct Options {
  int64_t B = 16, H = 12, Hkv = 0, T = 1024, D = 64;
  DType dtype = DType::bf16;
  bool causal = true, packed = true;
  int iters = 20;
  double max_seconds = 10;
  std::string impl = "both";
  std::string tiles = "default";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      ATH_CHECK(i + 1 < argc, "bench_cuda_attention", a, " needs a value", Hint{"see the usage at the top of bench/cuda_attention.cpp"});
      return argv[++i];
    };
    if (a == "--B") o.B = std::stoll(next());
    else if (a == "--H") o.H = std::stoll(next());
    else if (a == "--Hkv") o.Hkv = std::stoll(next());
    else if (a == "--T") o.T = std::stoll(next());
    else if (a == "--D") o.D = std::stoll(next());
    else if (a == "--dtype") o.dtype = dtype_from_name(next());
    else if (a == "--noncausal") o.causal = false;
    else if (a == "--contiguous") o.packed = false;
    else if (a == "--iters") o.iters = std::stoi(next());
    else if (a == "--max-seconds") o.max_seconds = std::stod(next());
    else if (a == "--impl") o.impl = next();
    else if (a == "--tiles") o.tiles = next();
    else ATH_FAIL("bench_cuda_attention", "unknown argument ", a, Hint{"see the usage at the top of bench/cuda_attention.cpp"});
  }
  ATH_CHECK(o.impl == "both" || o.impl == "reference" || o.impl == "fast" || o.impl == "cudnn", "bench_cuda_attention",
            "--impl ", o.impl, " is not one of both, reference, fast, cudnn",
            Hint{"see the usage at the top of bench/cuda_attention.cpp"});
  if (o.tiles != "default" && o.tiles != "all") cuda::parse_attention_tiles(o.tiles.c_str());  // names checked up front
  return o;
}

// JSON string contents: quotes, backslashes and control characters escaped.
std::string json_escape(const std::string& s) {
  std::string r;
  for (const char c : s) {
    if (c == '"' || c == '\\') r += '\\', r += c;
    else if (static_cast<unsigned char>(c) < 0x20) r += ' ';
    else r += c;
  }
  return r;
}

// The "cudnn" entry: cuDNN's forward and backward are first called directly once (so a plan
// that cuDNN refuses is reported, not timed as our fallback), then timed through
// attention_forward/backward with the candidate on. `time3` times (fwd, bwd, fwd+bwd) and
// returns the usual JSON fields.
template <class Fwd, class Bwd, class Time3>
std::string cudnn_entry(const void* q, const void* k, const void* v, void* out, float* lse, const void* dout,
                        void* dq, void* dk, void* dv, void* ws, const cuda::AttentionDims& d,
                        const cuda::AttentionLayout& L, bool causal, double scale, DType dtype, cudaStream_t st,
                        Fwd&& fwd, Bwd&& bwd, Time3&& time3) {
  auto unavailable = [](const std::string& why) {
    return "{\"available\": false, \"reason\": \"" + json_escape(why) + "\"}";
  };
  if (!cuda::attention_cudnn_supported(q, k, v, out, d, L, dtype)) {
    const std::string rule = cuda::attention_cudnn_decline_reason(d, L, dtype);
    return unavailable(!rule.empty() ? rule : !cuda::attention_cudnn_unavailable_reason().empty()
                                                  ? cuda::attention_cudnn_unavailable_reason()
                                                  : "operands not 16-byte aligned");
  }
  // The first calls build cuDNN's plans (heuristics, perhaps a run-time compilation): their
  // wall time is reported apart ("first_calls_ms").
  const auto t0 = std::chrono::steady_clock::now();
  if (!cuda::attention_cudnn_forward(q, k, v, out, lse, d, L, causal, scale, dtype, st) ||
      !cuda::attention_cudnn_backward(q, k, v, out, dout, lse, dq, dk, dv, d, L, causal, scale, dtype, ws, st))
    return unavailable(cuda::attention_cudnn_last_failure());
  ATH_CUDA(cudaStreamSynchronize(st));
  const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const cuda::CandidateOverride on(cuda::Candidate::attention_cudnn, true);
  cuda::set_attention_impl(cuda::AttentionImpl::fast);  // "reference" would bypass the candidate
  char first[64];
  std::snprintf(first, sizeof first, "\"first_calls_ms\": %.1f, ", first_ms);
  return "{\"available\": true, " + std::string(first) + time3(fwd, bwd) + "}";
}

// --tiles all: the fast forward in every forward configuration and the fast backward in every
// backward configuration (the other half in the default), as the "tiles" JSON object. A
// configuration that throws (say, more shared memory than this GPU allows) is recorded with its
// error and the others still run; each result also goes to stderr as it comes (the log keeps
// what was measured should a later configuration bring the process down).
template <class Time>
std::string measure_tiles(const Time& time_ms, const std::function<void()>& fwd, const std::function<void()>& bwd,
                          double fwd_flop, int64_t D) {
  auto tflops = [](double flop, double ms) { return flop / (ms * 1e-3) / 1e12; };
  // One configuration's JSON entry: "name": {"instantiated": .., "<pass>_ms": .., "<pass>_tflops": ..}.
  auto entry = [&](const char* name, bool inst, const char* pass, const std::function<void()>& fn, double flop) {
    char buf[256];
    std::string r;
    try {
      const double ms = time_ms(fn);
      std::snprintf(buf, sizeof buf, "\"%s\": {\"instantiated\": %s, \"%s_ms\": %.4f, \"%s_tflops\": %.2f}", name,
                    inst ? "true" : "false", pass, ms, pass, tflops(flop, ms));
      r = buf;
    } catch (const std::exception& e) {
      std::snprintf(buf, sizeof buf, "\"%s\": {\"instantiated\": %s, \"error\": \"", name, inst ? "true" : "false");
      r = buf + json_escape(std::string(e.what()).substr(0, 300)) + "\"}";
    }
    std::fprintf(stderr, "bench_cuda_attention: tiles %s\n", r.c_str());
    return r;
  };
  const cuda::AttentionTiles saved = cuda::attention_tiles();
  std::string f_json, b_json;
  for (const cuda::FwdTiles t : cuda::kFwdTilesAll) {
    cuda::set_attention_tiles({t, cuda::AttentionTiles{}.bwd});
    f_json += (f_json.empty() ? "" : ", ") +
              entry(cuda::fwd_tiles_name(t), cuda::attention_tiles_instantiated(t, D), "fwd", fwd, fwd_flop);
  }
  for (const cuda::BwdTiles t : cuda::kBwdTilesAll) {
    cuda::set_attention_tiles({cuda::AttentionTiles{}.fwd, t});
    b_json += (b_json.empty() ? "" : ", ") +
              entry(cuda::bwd_tiles_name(t), cuda::attention_tiles_instantiated(t, D), "bwd", bwd, 2.5 * fwd_flop);
  }
  cuda::set_attention_tiles(saved);
  return "\"tiles\": {\"fwd\": {" + f_json + "}, \"bwd\": {" + b_json + "}}";
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  if (o.tiles != "default" && o.tiles != "all") cuda::set_attention_tiles(cuda::parse_attention_tiles(o.tiles.c_str()));
  else cuda::set_attention_tiles(cuda::AttentionTiles{});
  const int64_t Hkv = o.Hkv > 0 ? o.Hkv : o.H;
  const cuda::AttentionDims d{o.B, o.H, o.T, o.T, o.D, o.D, Hkv};
  const cuda::AttentionLayout L = o.packed ? cuda::AttentionLayout::packed_qkv(d) : cuda::AttentionLayout::contiguous(d);
  cuda::attention_check(d, L, o.dtype, "bench_cuda_attention");
  cuda::require_device(0, "bench_cuda_attention");
  const cuda::DeviceInfo info = cuda::device_info(0);  // before any kernel (a fault would stop it later)
  const cudaStream_t st = cuda::compute_stream(0);
  const std::size_t es = dtype_size(o.dtype);
  const int64_t n_in = o.B * o.T * (o.H + 2 * Hkv) * o.D, n_out = o.B * o.T * o.H * o.D;
  void *in = device_alloc(n_in * es), *gin = device_alloc(n_in * es), *out = device_alloc(n_out * es),
       *dout = device_alloc(n_out * es), *ws = device_alloc(cuda::attention_backward_workspace(d));
  auto* lse = static_cast<float*>(device_alloc(o.B * o.H * o.T * 4));
  bench::fill_random(in, n_in, o.dtype, 1);
  bench::fill_random(dout, n_out, o.dtype, 2);
  // Operand base pointers: packed, k and v are column offsets of the one qkv buffer.
  auto* base = static_cast<char*>(in);
  auto* gbase = static_cast<char*>(gin);
  const int64_t koff = o.packed ? o.H * o.D : o.B * o.H * o.T * o.D;
  const int64_t voff = o.packed ? (o.H + Hkv) * o.D : koff + o.B * Hkv * o.T * o.D;
  const double scale = 1.0 / std::sqrt(static_cast<double>(o.D));
  auto fwd = [&] {
    cuda::attention_forward(base, base + koff * es, base + voff * es, out, lse, d, L, o.causal, scale, o.dtype, st);
  };
  auto bwd = [&] {
    cuda::attention_backward(base, base + koff * es, base + voff * es, out, dout, lse, gbase, gbase + koff * es,
                             gbase + voff * es, d, L, o.causal, scale, o.dtype, ws, st);
  };

  bench::EventTimer timer(st, o.iters, o.max_seconds);
  auto time_ms = [&](auto&& fn) { return timer.ms(fn); };
  const double fwd_flop = 4.0 * o.B * o.H * o.T * o.T * o.D * (o.causal ? 0.5 : 1.0);
  auto tflops = [](double flop, double ms) { return flop / (ms * 1e-3) / 1e12; };
  // Forward, backward and both of (f, b): ms and TFLOP/s as JSON fields.
  auto time3 = [&](auto& f, auto& b) {
    const double f_ms = time_ms(f), b_ms = time_ms(b);
    const double fb_ms = time_ms([&] {
      f();
      b();
    });
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "\"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f, \"fwd_tflops\": %.2f, "
                  "\"bwd_tflops\": %.2f, \"fwd_bwd_tflops\": %.2f",
                  f_ms, b_ms, fb_ms, tflops(fwd_flop, f_ms), tflops(2.5 * fwd_flop, b_ms), tflops(3.5 * fwd_flop, fb_ms));
    return std::string(buf);
  };
  // One implementation's figures as a JSON object.
  auto measure = [&](cuda::AttentionImpl impl) {
    cuda::set_attention_impl(impl);
    const bool fallback = impl == cuda::AttentionImpl::fast &&
                          !cuda::attention_fast_backward_supported(base, base + koff * es, base + voff * es, out, dout,
                                                                   gbase, gbase + koff * es, gbase + voff * es, d, L,
                                                                   o.dtype);
    return std::string("{\"fallback\": ") + (fallback ? "true" : "false") + ", " + time3(fwd, bwd) + "}";
  };
  std::string results;
  if (o.impl == "both" || o.impl == "reference") results += "\"reference\": " + measure(cuda::AttentionImpl::reference);
  if (o.impl == "both" || o.impl == "fast")
    results += std::string(results.empty() ? "" : ", ") + "\"fast\": " + measure(cuda::AttentionImpl::fast);
  if (o.impl == "both" || o.impl == "cudnn") {
    // cuDNN's entry (its own block: cudnn_entry above).
    results += std::string(results.empty() ? "" : ", ") + "\"cudnn\": " +
               cudnn_entry(base, base + koff * es, base + voff * es, out, lse, dout, gbase, gbase + koff * es,
                           gbase + voff * es, ws, d, L, o.causal, scale, o.dtype, st, fwd, bwd, time3);
  }
  if (o.tiles == "all") {
    // Our kernels in each configuration, cuDNN's candidate off whatever the environment says;
    // last, so that a fault in a variant leaves the other entries measured.
    const cuda::CandidateOverride no_cudnn(cuda::Candidate::attention_cudnn, false);
    cuda::set_attention_impl(cuda::AttentionImpl::fast);
    const bool taken = cuda::attention_fast_backward_supported(base, base + koff * es, base + voff * es, out, dout, gbase,
                                                               gbase + koff * es, gbase + voff * es, d, L, o.dtype);
    results += std::string(results.empty() ? "" : ", ") +
               (taken ? measure_tiles(time_ms, fwd, bwd, fwd_flop, o.D) : std::string("\"tiles\": \"fallback\""));
  }
  const cuda::AttentionTiles o_tiles = cuda::attention_tiles();  // the "fast" entry's
  std::printf(
      "{\"bench\": \"cuda_attention\", \"gpu\": \"%s\", \"B\": %lld, \"H\": %lld, \"Hkv\": %lld, \"T\": %lld, \"D\": %lld, "
      "\"dtype\": \"%s\", \"causal\": %s, \"layout\": \"%s\", \"fast_tiles\": \"%s,%s\", %s}\n",
      info.name.c_str(), static_cast<long long>(o.B), static_cast<long long>(o.H), static_cast<long long>(Hkv),
      static_cast<long long>(o.T), static_cast<long long>(o.D), dtype_name(o.dtype), o.causal ? "true" : "false",
      o.packed ? "packed_qkv" : "contiguous", cuda::fwd_tiles_name(o_tiles.fwd), cuda::bwd_tiles_name(o_tiles.bwd),
      results.c_str());
  for (void* p : {in, gin, out, dout, ws, static_cast<void*>(lse)}) ATH_CUDA(cudaFree(p));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cuda_attention: %s\n", e.what());
  return 1;
}
