// The Trainer's checkpoints: what a training state is on disk and how any layout restores it
// (contract in include/athanor/train/checkpointer.h).
#include "athanor/train/checkpointer.h"

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/ckpt/sharded_checkpoint.h"
#include "athanor/core/rng.h"
#include "athanor/dist/process_group.h"
#include "athanor/dist/zero.h"
#include "athanor/ops.h"
#include "athanor/train/parallel_context.h"
#include "athanor/train/trainer.h"
#include "ckpt/checksum.h"
#include "train/batch_feed.h"

namespace athanor::train {
namespace fs = std::filesystem;

namespace {
// The config keys that fix the model's parameter names and shapes (all applicable model.*
// keys but dropout), as "key" -> canonical value text.
bool key_applies(const Config& c, const ConfigKey& k) {
  if (k.applies_to.empty()) return true;
  const auto eq = k.applies_to.find('=');
  // Model keys depend on model.type (a string choice): "|a|b|" contains "|value|".
  std::string allowed = "|", value = "|";
  allowed += k.applies_to.substr(eq + 1);
  allowed += "|";
  value += c.get_string(k.applies_to.substr(0, eq));
  value += "|";
  return allowed.find(value) != std::string::npos;
}
std::string value_text(const Config& c, const ConfigKey& k) {
  std::ostringstream o;
  o << std::setprecision(17);
  switch (k.default_value.index()) {
    case 0: o << c.get_int(k.path); break;
    case 1: o << c.get_float(k.path); break;
    case 2: o << (c.get_bool(k.path) ? "true" : "false"); break;
    case 3: o << c.get_string(k.path); break;
    case 4: for (auto v : c.get_int_list(k.path)) o << v << ","; break;
    default: for (auto v : c.get_float_list(k.path)) o << v << ","; break;
  }
  return o.str();
}
std::map<std::string, std::string> model_shape(const Config& c) {
  std::map<std::string, std::string> out;
  for (const auto& k : config_schema())
    if (k.path.rfind("model.", 0) == 0 && k.path != "model.dropout" && key_applies(c, k)) out[k.path] = value_text(c, k);
  return out;
}
std::string shape_hash(const std::map<std::string, std::string>& shape) {
  std::string canon;
  for (const auto& [k, v] : shape) canon += k + "=" + v + "\n";
  return ckpt::sha256_hex(canon);
}
}  // namespace

Checkpointer::Checkpointer(std::string dir, CheckpointParts parts) : dir_(std::move(dir)), p_(parts) {}

std::string Checkpointer::save(const TrainCounters& c) {
  const ParallelContext& par = p_.par;
  // Under data parallel every rank saves its own part, under the logical (1-process) names
  // (ckpt/sharded_checkpoint.h): no rank ever holds the full state. The scalars (steps, lrs)
  // are gathered: a collective, so every rank calls save.
  const ckpt::NamedTensors model_tensors = p_.dp ? p_.dp->local_state_dict() : p_.task.module().state_dict();
  const ckpt::NamedTensors optim_tensors = p_.dp ? p_.dp->local_optimizer_state() : p_.optimizer->state_tensors();
  const std::map<std::string, double> optim_scalars =
      p_.dp ? par.merge_over_stages(p_.dp->full_optimizer_scalars()) : p_.optimizer->state_scalars();
  const auto shape = model_shape(p_.config);
  const data::LoaderPosition pos = p_.feed.position();
  const GeneratorState rng = default_generator().state();
  nlohmann::json j;
  j["format"] = "athanor-train-state";
  j["version"] = ATHANOR_VERSION;
  j["step"] = c.step;
  j["skipped_steps"] = c.skipped;
  j["max_steps"] = c.max_steps;
  j["epoch"] = pos.epoch;
  // "samples": the position in the epoch's global sample stream, so that another world size or
  // micro-batch continues with the same global batches.
  const int64_t micro = p_.config.get_int("trainer.batch_size");
  j["loader"] = {{"epoch", pos.epoch}, {"batch", pos.batch}, {"samples", pos.batch * micro * par.dp_size()}};
  j["dist"] = {{"world_size", par.world_size()}, {"zero_stage", par.zero_stage()}, {"micro_batch", micro}, {"dp", par.dp_size()},
               {"tp", par.tp_size()}, {"pp", par.pp_size()},
               {"sequence_parallel", par.tp_size() > 1 && p_.config.get_bool("dist.sequence_parallel")}};
  if (par.pp_size() > 1)
    j["dist"]["pipeline"] = {{"schedule", p_.config.get_string("dist.pp_schedule")},
                             {"virtual_stages", p_.config.get_int("dist.virtual_stages")},
                             {"pp_layers", p_.config.get_int_list("dist.pp_layers")}};
  j["rng"] = {{"default", {{"seed", rng.seed}, {"offset", rng.offset}}}};
  j["scheduler_step"] = p_.scheduler.current_step();
  j["optimizer"] = {{"type", p_.optim.name()}, {"scalars", optim_scalars}};
  j["model_shape"] = shape;
  j["config_hash"] = shape_hash(shape);
  j["seed"] = p_.config.get_int("seed");
  j["lr_factor"] = c.lr_factor;
  if (p_.scaler.enabled())
    j["scaler"] = {{"scale", p_.scaler.get_scale()}, {"growth_tracker", p_.scaler.growth_tracker()}, {"skipped_steps", p_.scaler.skipped_steps()}};
  const std::map<std::string, std::string> meta{{"format", "athanor"}, {"step", std::to_string(c.step)}};
  if (p_.dp)  // every rank writes its shards, rank 0 the indexes, state.json and the manifest
    return ckpt::save_sharded_checkpoint(*par.world(), dir_, c.step,
                                         {par.checkpoint_part("model", model_tensors, false, meta),
                                          par.checkpoint_part("optimizer", optim_tensors, true, meta)},
                                         {{"state.json", j.dump(2) + "\n"}});
  return ckpt::save_checkpoint(dir_, c.step, {{"model.safetensors", model_tensors, meta}, {"optimizer.safetensors", optim_tensors, meta}},
                               {{"state.json", j.dump(2) + "\n"}});
}

void Checkpointer::verify(const std::string& dir) const {
  if (p_.par.distributed()) ckpt::verify_checkpoint_across(*p_.par.world(), dir);  // each rank hashes 1/N of the files
  else ckpt::verify_checkpoint(dir);
}

std::string stale_latest_note(const std::string& checkpoints_dir) {
  const std::string named = ckpt::read_latest(checkpoints_dir);
  if (named.empty()) return "";
  std::error_code ec;
  if (fs::is_directory(fs::path(checkpoints_dir) / named, ec)) return "";
  return (fs::path(checkpoints_dir) / "latest").string() + " names '" + named + "', which is not in " + checkpoints_dir +
         " (deleted, or never written by this run)";
}

std::string Checkpointer::latest_valid(const std::function<void(const std::string&)>& skipped) const {
  const auto found = ckpt::find_latest_valid(dir_, [this](const std::string& d) { verify(d); });
  for (const auto& s : found.skipped) skipped(s);
  return found.path;
}

TrainCounters Checkpointer::restore(const std::string& dir) {
  verify(dir);
  const ParallelContext& par = p_.par;
  const fs::path state_path = fs::path(dir) / "state.json";
  nlohmann::json j;
  try {
    std::ifstream f(state_path);
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    ATH_FAIL("resume", "'", state_path.string(), "' is not valid JSON: ", e.what(), Hint{"use an earlier checkpoint"});
  }
  TrainCounters c;
  try {
    ATH_CHECK(j.value("format", "") == "athanor-train-state", "resume", "'", state_path.string(), "' is not an athanor training state");
    // The model shape must match: the weights would not fit otherwise.
    const auto saved = j.at("model_shape").get<std::map<std::string, std::string>>();
    const auto now = model_shape(p_.config);
    if (j.at("config_hash").get<std::string>() != shape_hash(now)) {
      std::string diff;
      std::set<std::string> keys;
      for (const auto& [k, v] : saved) keys.insert(k);
      for (const auto& [k, v] : now) keys.insert(k);
      for (const auto& k : keys) {
        const auto a = saved.count(k) ? saved.at(k) : std::string("(unset)");
        const auto b = now.count(k) ? now.at(k) : std::string("(unset)");
        if (a != b) diff += (diff.empty() ? "" : ", ") + k + " (checkpoint " + a + ", config " + b + ")";
      }
      ATH_FAIL("resume", "cannot resume from '", dir, "': the config changes the model shape: ", diff.empty() ? "hash differs" : diff,
               Hint{"restore those model.* keys, or start a new run (another name, or resume: off)"});
    }
    const std::string opt = j.at("optimizer").at("type").get<std::string>();
    ATH_CHECK(opt == p_.optim.name(), "resume", "cannot resume from '", dir, "': it holds ", opt, " optimizer state but optimizer.type makes ",
              p_.optim.name(), Hint{"restore optimizer.type, or start a new run"});
    // One file (1 process) or the shards of every rank of the saving run (any layout). Shards
    // are memory-mapped: each rank reads only the tensors it keeps.
    const std::string model_path = (fs::path(dir) / "model.safetensors").string();
    auto optim_file = ckpt::load_checkpoint_tensors(dir, "optimizer");
    if (p_.dp) {  // the data-parallel wrapper may shard parameters: it takes what this rank holds
      auto model_file = ckpt::load_checkpoint_tensors(dir, "model");  // logical tensors, whatever layout saved them
      p_.dp->load_full_state_dict(par.local(nn::StateDict(model_file.tensors.begin(), model_file.tensors.end()), false));
    } else if (fs::exists(model_path)) {  // straight into the parameters: one copy, as fast as read()
      ckpt::load_safetensors_into(model_path, p_.task.module().state_dict());
    } else {
      auto model_file = ckpt::load_checkpoint_tensors(dir, "model");
      p_.task.module().load_state_dict(nn::StateDict(model_file.tensors.begin(), model_file.tensors.end()));
    }
    const auto scalars = j.at("optimizer").at("scalars").get<std::map<std::string, double>>();
    if (p_.dp) p_.dp->load_full_optimizer_state(par.local(optim_file.tensors, true), scalars);  // each rank keeps its part
    else p_.optimizer->load_state(optim_file.tensors, scalars);
    // Loading bumped the weights' versions: remake their low-precision copies now rather than cast each one in the next step.
    if (p_.optim.low_precision_copies() != DType::f32) p_.optim.enable_low_precision_copies(p_.optim.low_precision_copies());
    c.step = j.at("step").get<int64_t>();
    c.skipped = j.at("skipped_steps").get<int64_t>();
    c.max_steps = j.value("max_steps", int64_t{0});
    p_.scheduler.set_step(j.at("scheduler_step").get<int64_t>());
    const auto& loader = j.at("loader");
    int64_t batch = loader.at("batch").get<int64_t>();
    if (loader.contains("samples")) {  // map the global sample position onto this run's micro-batch × dp
      const int64_t samples = loader.at("samples").get<int64_t>(), per = p_.config.get_int("trainer.batch_size") * par.dp_size();
      ATH_CHECK(samples % per == 0, "resume", "cannot resume from '", dir, "': it stopped after ", samples,
                " samples of its epoch, which is not a whole number of this run's global micro-batches (batch_size ",
                p_.config.get_int("trainer.batch_size"), " x dp ", par.dp_size(), " = ", per, ")",
                Hint{"choose trainer.batch_size and the number of data-parallel ranks so that batch_size x dp divides " +
                     std::to_string(samples)});
      batch = samples / per;
    }
    p_.feed.set_position({loader.at("epoch").get<int64_t>(), batch});
    c.lr_factor = j.value("lr_factor", 1.0);
    if (p_.scaler.enabled() && j.contains("scaler"))
      p_.scaler.load_state_dict({{"scale", scalar_tensor(j.at("scaler").at("scale").get<double>(), {DType::f64})},
                                 {"growth_tracker", scalar_tensor(static_cast<double>(j.at("scaler").at("growth_tracker").get<int64_t>()),
                                                                  {DType::f64})}});
    default_generator().set_state({j.at("rng").at("default").at("seed").get<uint64_t>(), j.at("rng").at("default").at("offset").get<uint64_t>()});
  } catch (const nlohmann::json::exception& e) {
    ATH_FAIL("resume", "'", state_path.string(), "' lacks a field or has a wrong type: ", e.what(), Hint{"use an earlier checkpoint"});
  }
  return c;
}

}  // namespace athanor::train
