// JSON encoding of the run records (metrics.jsonl and health.jsonl lines), in the
// field order documented in include/athanor/observe/metrics.h.
#include "athanor/observe/metrics.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace athanor::observe {
namespace {
using Json = nlohmann::ordered_json;

// JSON has no inf/nan: they are written as null.
Json number(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }
}  // namespace

std::string to_json(const StepMetrics& m) {
  Json j;
  j["step"] = m.step;
  j["loss"] = number(m.loss);
  j["lr"] = number(m.lr);
  j["grad_norm"] = number(m.grad_norm);
  j["grad_norm_clipped"] = number(m.grad_norm_clipped);
  j["skipped"] = m.skipped;
  j["skipped_total"] = m.skipped_total;
  if (m.loss_scale > 0) j["loss_scale"] = number(m.loss_scale);
  j["targets"] = m.targets;
  j["throughput"] = number(m.throughput);
  j["step_s"] = number(m.step_seconds);
  j["data_s"] = number(m.data_seconds);
  j["forward_s"] = number(m.forward_seconds);
  j["backward_s"] = number(m.backward_seconds);
  j["optimizer_s"] = number(m.optimizer_seconds);
  j["comm_s"] = number(m.comm_seconds);
  if (m.mfu >= 0 && std::isfinite(m.mfu)) j["mfu"] = m.mfu;
  if (m.gemm_efficiency >= 0 && std::isfinite(m.gemm_efficiency)) j["gemm_efficiency"] = m.gemm_efficiency;
  Json mem = Json::object();
  for (const auto& t : m.memory) mem[t.tag] = Json{{"cur", t.current}, {"peak", t.peak}};
  j["mem"] = mem;
  if (!m.nonfinite_params.empty()) j["nonfinite_params"] = m.nonfinite_params;
  if (!m.layers.empty()) {
    Json layers = Json::object();
    for (const auto& l : m.layers) layers[l.name] = Json{{"grad", number(l.grad_norm)}, {"param", number(l.param_norm)}};
    j["layers"] = layers;
  }
  if (!m.comm.empty()) {
    Json comm = Json::object();
    for (const auto& c : m.comm)
      comm[c.dimension] = Json{{"ops", c.ops}, {"bytes", number(c.bytes)}, {"wire_bytes", number(c.wire_bytes)}, {"s", number(c.seconds)}};
    j["comm"] = comm;
  }
  if (!m.pipeline.schedule.empty())
    j["pipeline"] = Json{{"schedule", m.pipeline.schedule},         {"stages", m.pipeline.stages},
                         {"virtual_stages", m.pipeline.virtual_stages}, {"micro_batches", m.pipeline.micro_batches},
                         {"bubble", number(m.pipeline.bubble)},       {"theory", number(m.pipeline.theory)},
                         {"recv_wait_s", number(m.pipeline.recv_wait_seconds)}, {"schedule_s", number(m.pipeline.step_seconds)}};
  return j.dump();
}

std::string to_json(const EvalMetrics& e) {
  Json j;
  j["step"] = e.step;
  j["val_loss"] = number(e.loss);
  if (e.accuracy >= 0) j["val_accuracy"] = number(e.accuracy);
  return j.dump();
}

std::string to_json(const HealthEvent& e) {
  Json j;
  j["step"] = e.step;
  j["kind"] = e.kind;
  j["severity"] = e.severity;
  j["message"] = e.message;
  j["suggestions"] = e.suggestions;
  Json d = Json::object();
  for (const auto& [k, v] : e.details) d[k] = v;
  j["details"] = d;
  // Invalid UTF-8 in a message (e.g. a tensor name) must not make the line unwritable.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace athanor::observe
