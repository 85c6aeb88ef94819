// `athanor ops`: the op registry as a table (category, reference, backward, a column per
// device with a kernel), and `athanor ops --bench NAME`: one op's forward and backward
// timed on every device that has a kernel for it, at each dtype, on its harness cases.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "athanor/core/error.h"
#include "athanor/ops/op_harness.h"
#include "athanor/ops/registry.h"
#include "command_registry.h"

namespace athanor::cli {
namespace {

constexpr DeviceType kDevices[] = {DeviceType::cpu, DeviceType::cuda};

// "x [256, 6] transposed, weight [6]": the case's inputs as timed (the label names the scale-1 shapes).
std::string describe_inputs(const OpDef& op, const OpCase& c) {
  std::string s;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const CaseInput& in = c.inputs[i];
    if (!in.value.defined()) continue;
    const std::string name = i < op.inputs.size() ? op.inputs[i] : op.inputs.empty() ? "input" : op.inputs[0] + "[" + std::to_string(i) + "]";
    s += (s.empty() ? "" : ", ") + name + " " + shape_str(in.value.sizes());
    if (in.layout != CaseLayout::contiguous) s += std::string(" ") + layout_name(in.layout);
  }
  return s;
}

void print_table() {
  std::vector<std::string> header = {"op", "autocast", "reference", "backward"};
  for (DeviceType d : kDevices) header.push_back(device_type_name(d));
  header.push_back("derivative");
  std::vector<std::vector<std::string>> rows;
  for (const OpDef* op : op_registry()) {
    bool backward = false;
    for (DeviceType d : kDevices) backward = backward || op->kernels[device_slot(d)].backward != nullptr;
    std::vector<std::string> r = {op->name, op->category ? autocast_category_name(*op->category) : "-",
                                  op->reference ? "yes" : "-", backward ? "yes" : "-"};
    for (DeviceType d : kDevices) r.push_back(op->has_kernel(d) ? "yes" : "-");
    r.push_back(op->derivative);
    rows.push_back(std::move(r));
  }
  std::vector<std::size_t> width(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) {
    width[c] = header[c].size();
    for (const auto& r : rows) width[c] = std::max(width[c], r[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& r) {
    std::string line;
    for (std::size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    std::cout << line << "\n";
  };
  print_row(header);
  std::vector<std::string> rule;
  for (std::size_t w : width) rule.push_back(std::string(w, '-'));
  print_row(rule);
  for (const auto& r : rows) print_row(r);
  std::cout << op_registry().size() << " ops\n";
}

DType parse_dtype(const std::string& s) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16})
    if (s == dtype_name(d)) return d;
  ATH_FAIL("ops", "unknown dtype '", s, "'", Hint{"use one of f32, f64, bf16, f16"});
}

int bench(const std::string& name, const std::string& dtype, int scale, int reps) {
  const OpDef* op = find_op(name);
  if (!op) {
    std::string known;
    for (const OpDef* o : op_registry()) known += (known.empty() ? "" : ", ") + o->name;
    ATH_FAIL("ops", "no op named '", name, "'", Hint{"registered ops: " + known});
  }
  ATH_CHECK(scale >= 1 && reps >= 1, "ops", "--scale and --reps must be >= 1, got ", scale, " and ", reps);
  std::vector<DType> dtypes = op->dtypes;
  if (!dtype.empty()) {
    const DType want = parse_dtype(dtype);
    ATH_CHECK(std::find(dtypes.begin(), dtypes.end(), want) != dtypes.end(), "ops", "'", name, "' does not run in ", dtype,
              Hint{"`athanor ops` lists the ops; this one runs in its registered dtypes only"});
    dtypes = {want};
  }
  const std::vector<OpCase> cases = op->cases(scale);
  std::printf("%s: %zu cases at scale %d, median of %d runs (us)\n", op->name.c_str(), cases.size(), scale, reps);
  for (DeviceType d : kDevices) {
    if (!op->has_kernel(d)) {
      std::printf("  %s: no kernel\n", device_type_name(d));
      continue;
    }
    if (d != DeviceType::cpu) {  // the harness's inputs live on the CPU; a CUDA build moves them there first
      std::printf("  %s: kernel registered, but this build has no %s device to time it on\n", device_type_name(d),
                  device_type_name(d));
      continue;
    }
    for (DType dt : dtypes)
      for (const OpCase& c : cases) {
        if (!c.dtypes.empty() && std::find(c.dtypes.begin(), c.dtypes.end(), dt) == c.dtypes.end()) continue;
        const OpTiming t = time_case(c, dt, reps);
        char bwd[32] = "-";
        if (t.backward_us >= 0) std::snprintf(bwd, sizeof bwd, "%.1f", t.backward_us);
        std::printf("  %s %-4s  forward %10.1f  backward %10s  %s\n", device_type_name(d), dtype_name(dt), t.forward_us, bwd,
                    describe_inputs(*op, c).c_str());
      }
  }
  return 0;
}

const bool registered = register_command(
    {"ops", "Print the op registry (autocast category, reference, backward, kernels per device); --bench NAME times one op",
     [](CLI::App& sub) {
       auto name = std::make_shared<std::string>();
       auto dtype = std::make_shared<std::string>();
       auto scale = std::make_shared<int>(16);
       auto reps = std::make_shared<int>(20);
       sub.add_option("--bench", *name, "time this op's forward and backward on each device with a kernel");
       sub.add_option("--dtype", *dtype, "with --bench: only this dtype (f32, f64, bf16, f16)");
       sub.add_option("--scale", *scale, "with --bench: multiply the harness cases' leading sizes by this");
       sub.add_option("--reps", *reps, "with --bench: timed runs per case (the median is printed)");
       return [name, dtype, scale, reps] {
         if (name->empty()) {
           print_table();
           return 0;
         }
         return bench(*name, *dtype, *scale, *reps);
       };
     }});
}  // namespace
}  // namespace athanor::cli
