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
    for (const auto& l : m.layers) {
      Json v{{"grad", number(l.grad_norm)}, {"param", number(l.param_norm)}};
      if (l.update_ratio >= 0 || !std::isfinite(l.update_ratio)) v["update"] = number(l.update_ratio);
      v["dim"] = l.ndim;
      layers[l.name] = v;
    }
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
  if (!m.activations.empty()) {
    Json acts = Json::object();
    for (const auto& a : m.activations) {
      Json v{{"mean", number(a.mean)}, {"std", number(a.std)}, {"absmax", number(a.absmax)}, {"zero", number(a.zero_frac)}};
      if (a.dead_frac >= 0) v["dead"] = number(a.dead_frac);
      if (a.saturated_frac >= 0) v["sat"] = number(a.saturated_frac);
      v["units"] = a.units;
      acts[a.name] = v;
    }
    j["acts"] = acts;
  }
  if (m.input.present) {
    const InputStats& in = m.input;
    j["input"] = Json{{"mean", number(in.mean)},     {"std", number(in.std)},
                      {"absmax", number(in.absmax)}, {"samples", in.samples},
                      {"max_id", in.max_id},         {"max_absmax", number(in.max_absmax)},
                      {"median_absmax", number(in.median_absmax)}, {"nonfinite_ids", in.nonfinite_ids}};
  }
  if (m.elapsed_seconds >= 0) j["elapsed_s"] = number(m.elapsed_seconds);
  if (m.totals.steps > 0) {
    const PhaseTotals& t = m.totals;
    j["totals"] = Json{{"steps", t.steps},       {"step_s", number(t.step_s)},         {"data_s", number(t.data_s)},
                       {"forward_s", number(t.forward_s)}, {"backward_s", number(t.backward_s)},
                       {"optimizer_s", number(t.optimizer_s)}, {"comm_s", number(t.comm_s)}};
  }
  if (!m.rank_compute_seconds.empty()) {
    Json r = Json::array();
    for (double v : m.rank_compute_seconds) r.push_back(number(v));
    j["ranks"] = Json{{"compute_s", r}};
  }
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
  if (!e.fix.empty()) {
    Json f = Json::object();
    for (const auto& [k, v] : e.fix) f[k] = v;
    j["fix"] = f;
  }
  // Invalid UTF-8 in a message (e.g. a tensor name) must not make the line unwritable.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace athanor::observe
