// The profiler on cuda (observe/profiler.h: set_device; issue 30's "CUDA events per op, the
// same op table and Chrome trace"): a GEMM-heavy step (a 3-layer MLP of 2048-wide f32 linears
// over 2048 rows: forward, backward, SGD) profiled op by op —
//  - the op table's device column is filled for the forward ops and the backward nodes, and
//    linear's device time dominates (its GEMMs are the step's work);
//  - the device self times of all events sum to within 10% of the step's device time timed by
//    two CUDA events around it (the events cover the step; gaps where the device waits for
//    the host are small in a GEMM-bound step);
//  - recording issues no host sync (resolution waits only when the table is asked for);
//  - the Chrome trace has a "GPU cuda:0" track holding linear's events.
#include <fstream>
#include <nlohmann/json.hpp>

#include "athanor/nn/layers.h"
#include "athanor/observe/profiler.h"
#include "athanor/ops.h"
#include "athanor/optim/optimizer.h"
#include "gpu_test.h"
#include "test_util.h"

using namespace athanor;
using observe::Profiler;

TEST(GpuProfiler, DeviceTimesPerOpCoverAGemmHeavyStep) {
  ATH_REQUIRE_GPU();
  constexpr int64_t W = 2048, B = 2048;
  std::vector<std::shared_ptr<nn::Linear>> layers;
  optim::NamedTensors named;
  for (int i = 0; i < 3; ++i) {
    layers.push_back(std::make_shared<nn::Linear>(W, W));
    layers.back()->to(Device::cuda(0));
    for (auto& [n, p] : layers.back()->named_parameters()) named.emplace_back(std::to_string(i) + "." + n, p);
  }
  optim::ParamGroup g;
  g.name = "all", g.lr = 1e-3, g.base_lr = 1e-3, g.params = named;
  auto opt = optim::make_sgd({g});
  const Tensor x = from_vector(gpu_test::random_vector(B * W, 7), {B, W}).cuda();
  const Tensor y = from_vector(gpu_test::random_vector(B * W, 8), {B, W}).cuda();
  auto step = [&] {
    Tensor h = x;
    for (size_t i = 0; i < layers.size(); ++i) h = i + 1 < layers.size() ? relu(layers[i]->forward(h)) : layers[i]->forward(h);
    mse_loss(h, y).backward();
    opt->step();
    opt->zero_grad();
  };
  step();  // warm-up: cuBLASLt plans, the allocator's segments
  ATH_CUDA(cudaStreamSynchronize(cuda::compute_stream(0)));

  Profiler& p = Profiler::instance();
  p.reset();
  p.set_device(Device::cuda(0));
  cudaEvent_t e0, e1;
  ATH_CUDA(cudaEventCreate(&e0));
  ATH_CUDA(cudaEventCreate(&e1));
  const std::uint64_t syncs0 = cuda::host_sync_count(0);
  p.start();
  ATH_CUDA(cudaEventRecord(e0, cuda::compute_stream(0)));
  step();
  ATH_CUDA(cudaEventRecord(e1, cuda::compute_stream(0)));
  p.stop();
  EXPECT_EQ(cuda::host_sync_count(0), syncs0) << "recording the device marks must not wait for the device";
  ATH_CUDA(cudaEventSynchronize(e1));
  float step_ms = 0;
  ATH_CUDA(cudaEventElapsedTime(&step_ms, e0, e1));

  const auto rows = p.rows();
  int64_t device_self = 0, linear_ns = 0;
  bool backward_timed = false;
  for (const auto& r : rows) {
    device_self += r.device_self_ns;
    if (r.name == "linear" && r.kind == 'f') linear_ns = r.device_total_ns;
    if (r.kind == 'b' && r.device_calls > 0) backward_timed = true;
    if (r.kind != 's') {
      EXPECT_EQ(r.device_calls, r.calls) << r.name << ": every call on this thread records marks";
    }
  }
  EXPECT_EQ(device_self, p.device_profiled_ns());
  const double sum_ms = static_cast<double>(device_self) / 1e6;
  EXPECT_NEAR(sum_ms, step_ms, 0.10 * step_ms) << "device self times " << sum_ms << " ms vs the step's " << step_ms
                                               << " ms\n" << p.table();
  EXPECT_TRUE(backward_timed) << p.table();
  EXPECT_GT(static_cast<double>(linear_ns) / 1e6, 0.2 * step_ms) << "the forward GEMMs are a large share\n" << p.table();
  const std::string table = p.table();
  EXPECT_NE(table.find("device ms"), std::string::npos) << table;
  std::printf("%s", table.c_str());

  const std::string path = athanor::testing::fresh_temp_dir("gpu_profiler") + "/trace.json";
  p.write_chrome_trace(path);
  const auto j = nlohmann::json::parse(std::ifstream(path));
  bool gpu_track = false;
  int gpu_linear = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("tid", 0) != 1000) continue;
    if (e["ph"] == "M" && e["args"]["name"] == "GPU cuda:0") gpu_track = true;
    if (e.value("name", "") == "linear") ++gpu_linear;
  }
  EXPECT_TRUE(gpu_track);
  EXPECT_EQ(gpu_linear, 3);
  p.reset();
  p.set_device(Device::cpu());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}
