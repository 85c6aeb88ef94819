// Sharded checkpoints under data parallel (contract in sharded_checkpoint.h).
#include "athanor/ckpt/sharded_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "athanor/core/error.h"

namespace athanor::ckpt {
namespace fs = std::filesystem;

namespace {
constexpr char kSep = '\x1f';  // separates the fields of an error sent between ranks

// Runs `f` on this rank, then every rank learns whether any rank failed; if one did,
// every rank throws its error (the lowest failing rank's, naming it).
void agree(dist::ProcessGroup& g, const std::function<void()>& f) {
  std::string mine;
  try {
    f();
  } catch (const Error& e) {
    mine = e.op() + kSep + e.message() + kSep + e.hint();
  } catch (const std::exception& e) {
    mine = std::string("checkpoint") + kSep + e.what() + kSep;
  }
  const auto all = dist::all_gather_strings(g, mine);
  int failed = 0, first = -1;
  for (int r = 0; r < g.size(); ++r)
    if (!all[r].empty()) {
      ++failed;
      if (first < 0) first = r;
    }
  if (first < 0) return;
  std::vector<std::string> fields;
  std::stringstream ss(all[first]);
  for (std::string part; std::getline(ss, part, kSep);) fields.push_back(part);
  fields.resize(3);
  std::string others = failed > 1 ? " (and " + std::to_string(failed - 1) + " other rank(s))" : "";
  ATH_FAIL(fields[0].empty() ? "checkpoint" : fields[0], "rank ", first, others, ": ", fields[1], Hint{fields[2]});
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

std::string shard_file_name(const std::string& prefix, int index, int count) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "-%05d-of-%05d.safetensors", index + 1, count);
  return prefix + buf;
}

std::string shard_index_name(const std::string& prefix) { return prefix + ".safetensors.index.json"; }

std::string save_sharded_checkpoint(dist::ProcessGroup& group, const std::string& checkpoints_dir, int64_t step,
                                    const std::vector<TensorFile>& shards, const std::vector<TextFile>& text_files) {
  const int me = group.rank(), n = group.size();
  agree(group, [&] {
    if (me == 0) begin_checkpoint(checkpoints_dir, step);
  });
  const std::string tmp = tmp_checkpoint_dir(checkpoints_dir, step);
  // Phase 2: this rank's shards, hashed here (the ranks hash in parallel).
  nlohmann::json report = nlohmann::json::array();  // per shard: its manifest entry and its tensors
  agree(group, [&] {
    for (const TensorFile& f : shards) {
      TensorFile shard{shard_file_name(f.name, me, n), f.tensors, f.metadata};
      shard.metadata["shard"] = std::to_string(me + 1) + "/" + std::to_string(n);
      const ManifestEntry e = write_tensor_file(tmp, shard);
      std::vector<std::string> names;
      nlohmann::json slices = nlohmann::json::object();
      uint64_t bytes = 0;
      for (const auto& [name, t] : f.tensors) {
        bytes += static_cast<uint64_t>(t.nbytes());
        auto it = f.slices.find(name);
        if (it == f.slices.end()) {
          names.push_back(name);
          continue;
        }
        const dist::ShardSpec& sp = it->second;
        Shape logical = t.sizes();
        logical[sp.dim] = sp.logical;
        slices[name] = {{"shape", logical}, {"dim", sp.dim},       {"parts", sp.parts}, {"logical", sp.logical},
                        {"padded", sp.padded}, {"index", sp.index}, {"count", sp.count}};
      }
      report.push_back({{"name", e.name}, {"bytes", e.bytes}, {"checksum", e.checksum}, {"algorithm", e.algorithm},
                        {"tensors", names}, {"slices", slices}, {"data_bytes", bytes}});
    }
  });
  const auto reports = dist::all_gather_strings(group, report.dump());
  // Phase 3: rank 0 writes the indexes, the text files and the manifest, and commits.
  agree(group, [&] {
    if (me != 0) return;
    std::vector<ManifestEntry> entries;
    std::map<std::string, nlohmann::json> index;   // prefix -> weight_map
    std::map<std::string, nlohmann::json> sliced;  // prefix -> tp_slices
    std::map<std::string, uint64_t> total;
    for (int r = 0; r < n; ++r) {
      const auto j = nlohmann::json::parse(reports[r]);
      ATH_CHECK(j.size() == shards.size(), "checkpoint", "rank ", r, " wrote ", j.size(), " tensor files, rank 0 ",
                shards.size(), Hint{"every rank must pass the same prefixes to save_sharded_checkpoint"});
      for (std::size_t i = 0; i < j.size(); ++i) {
        const auto& e = j[i];
        entries.push_back({e.at("name").get<std::string>(), e.at("bytes").get<uint64_t>(), e.at("checksum").get<std::string>(),
                           e.at("algorithm").get<std::string>()});
        const std::string& prefix = shards[i].name;
        total[prefix] += e.at("data_bytes").get<uint64_t>();
        for (const auto& t : e.at("tensors")) {
          const std::string name = t.get<std::string>();
          ATH_CHECK(!index[prefix].contains(name), "checkpoint", "tensor '", name, "' of '", prefix,
                    "' is in the shards of two ranks (", index[prefix].value(name, std::string()), " and ",
                    shard_file_name(prefix, r, n), ")", Hint{"each tensor must be saved by exactly one rank"});
          ATH_CHECK(!sliced[prefix].contains(name), "checkpoint", "'", name, "' of '", prefix, "' is saved both whole and as slices");
          index[prefix][name] = shard_file_name(prefix, r, n);
        }
        for (const auto& [name, sp] : e.at("slices").items()) {
          nlohmann::json& entry = sliced[prefix][name];
          const int count = sp.at("count").get<int>(), k = sp.at("index").get<int>();
          if (entry.is_null()) {
            entry = sp;
            entry.erase("index");
            entry["files"] = std::vector<std::string>(static_cast<std::size_t>(count));
          }
          for (const char* key : {"shape", "dim", "parts", "logical", "padded", "count"})
            ATH_CHECK(entry.at(key) == sp.at(key), "checkpoint", "the slices of '", name, "' of '", prefix,
                      "' disagree on their ", key, " (rank ", r, ")", Hint{"every tensor-parallel rank must shard it alike"});
          ATH_CHECK(k >= 0 && k < count && entry["files"][k].get<std::string>().empty(), "checkpoint", "slice ", k, " of '", name,
                    "' of '", prefix, "' is written twice (again by rank ", r, ")",
                    Hint{"each slice must be saved by exactly one rank"});
          ATH_CHECK(!index[prefix].contains(name), "checkpoint", "'", name, "' of '", prefix, "' is saved both whole and as slices");
          entry["files"][k] = shard_file_name(prefix, r, n);
        }
      }
    }
    for (const TensorFile& f : shards) {
      nlohmann::json j;
      j["metadata"] = {{"total_size", total[f.name]}, {"format", "athanor"}, {"shards", n}};
      j["weight_map"] = index[f.name].is_null() ? nlohmann::json::object() : index[f.name];
      if (!sliced[f.name].is_null()) j["tp_slices"] = sliced[f.name];
      entries.push_back(write_text_file(tmp, {shard_index_name(f.name), j.dump(2) + "\n"}));
    }
    for (const TextFile& f : text_files) entries.push_back(write_text_file(tmp, f));
    commit_checkpoint(checkpoints_dir, step, entries);
  });
  return (fs::path(checkpoints_dir) / step_dir_name(step)).string();
}

Manifest verify_checkpoint_across(dist::ProcessGroup& group, const std::string& dir) {
  const std::size_t me = static_cast<std::size_t>(group.rank()), n = static_cast<std::size_t>(group.size());
  Manifest m;
  agree(group, [&] { m = verify_checkpoint(dir, [&](std::size_t i) { return i % n == me; }); });
  return m;
}

bool has_checkpoint_tensors(const std::string& dir, const std::string& prefix) {
  return fs::exists(fs::path(dir) / (prefix + ".safetensors")) || fs::exists(fs::path(dir) / shard_index_name(prefix));
}

SafetensorsFile load_checkpoint_tensors(const std::string& dir, const std::string& prefix) {
  const fs::path single = fs::path(dir) / (prefix + ".safetensors");
  const fs::path index_path = fs::path(dir) / shard_index_name(prefix);
  if (fs::exists(single)) return load_safetensors(single.string());
  ATH_CHECK(fs::exists(index_path), "checkpoint", "'", dir, "' holds neither ", prefix, ".safetensors nor the index of its shards (",
            shard_index_name(prefix), ")", Hint{"pass a checkpoint directory (step-NNNNNN) written by athanor"});
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(index_path));
  } catch (const nlohmann::json::exception& e) {
    ATH_FAIL("checkpoint", "'", index_path.string(), "' is not valid JSON: ", e.what(), Hint{"use an earlier checkpoint"});
  }
  ATH_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "checkpoint", "'", index_path.string(),
            "' has no \"weight_map\" object", Hint{"use an earlier checkpoint"});
  std::map<std::string, std::string> where;  // tensor -> shard file
  std::set<std::string> files;
  // Tensor-parallel slices: name -> (spec, logical shape, file of each slice).
  struct Sliced {
    dist::ShardSpec spec;
    Shape shape;
    std::vector<std::string> files;
    std::vector<Tensor> parts;
  };
  std::map<std::string, Sliced> sliced;
  if (j.contains("tp_slices")) {
    try {
      for (const auto& [name, e] : j.at("tp_slices").items()) {
        Sliced s;
        s.spec.dim = e.at("dim").get<int>();
        s.spec.parts = e.at("parts").get<int>();
        s.spec.logical = e.at("logical").get<int64_t>();
        s.spec.padded = e.at("padded").get<int64_t>();
        s.spec.count = e.at("count").get<int>();
        s.shape = e.at("shape").get<Shape>();
        s.files = e.at("files").get<std::vector<std::string>>();
        ATH_CHECK(s.spec.count >= 1 && static_cast<int>(s.files.size()) == s.spec.count && s.spec.dim >= 0 &&
                      s.spec.dim < static_cast<int>(s.shape.size()) && s.shape[s.spec.dim] == s.spec.logical && s.spec.parts >= 1 &&
                      s.spec.padded % (static_cast<int64_t>(s.spec.parts) * s.spec.count) == 0,
                  "checkpoint", "'", index_path.string(), "': the slices of '", name, "' are inconsistent",
                  Hint{"the checkpoint is damaged; use an earlier one"});
        for (const std::string& f : s.files)
          if (!f.empty()) {
            ATH_CHECK(f.find('/') == std::string::npos && f != "..", "checkpoint", "'", index_path.string(), "' names a bad shard file '",
                      f, "' for '", name, "'");
            files.insert(f);
          }
        s.parts.resize(s.files.size());
        sliced.emplace(name, std::move(s));
      }
    } catch (const nlohmann::json::exception& e) {
      ATH_FAIL("checkpoint", "'", index_path.string(), "': bad \"tp_slices\": ", e.what(), Hint{"use an earlier checkpoint"});
    }
  }
  for (const auto& [name, file] : j["weight_map"].items()) {
    ATH_CHECK(file.is_string(), "checkpoint", "'", index_path.string(), "': the shard of '", name, "' is not a file name");
    const std::string f = file.get<std::string>();
    ATH_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "..", "checkpoint", "'", index_path.string(),
              "' names a bad shard file '", f, "' for '", name, "'");
    where[name] = f;
    files.insert(f);
  }
  // Every shard file of the prefix in the directory, listed or not (a tensor saved twice is an error).
  for (const auto& de : fs::directory_iterator(dir)) {
    const std::string f = de.path().filename().string();
    if (f.rfind(prefix + "-", 0) == 0 && f.size() > 12 && f.compare(f.size() - 12, 12, ".safetensors") == 0) files.insert(f);
  }
  SafetensorsFile out;
  std::set<std::string> seen;
  for (const std::string& f : files) {
    const fs::path p = fs::path(dir) / f;
    ATH_CHECK(fs::exists(p), "checkpoint", "'", index_path.string(), "' lists shard '", f, "', which is missing",
              Hint{"the checkpoint is incomplete; use an earlier one"});
    SafetensorsFile shard = load_safetensors(p.string());
    if (out.metadata.empty()) out.metadata = shard.metadata;
    for (auto& [name, t] : shard.tensors) {
      if (auto sl = sliced.find(name); sl != sliced.end()) {
        const auto k = std::find(sl->second.files.begin(), sl->second.files.end(), f) - sl->second.files.begin();
        ATH_CHECK(k < static_cast<std::ptrdiff_t>(sl->second.files.size()), "checkpoint", "shard '", p.string(), "' holds a slice of '",
                  name, "', which ", index_path.filename().string(), " places elsewhere",
                  Hint{"the checkpoint's index and shards do not belong together"});
        sl->second.parts[static_cast<std::size_t>(k)] = std::move(t);
        continue;
      }
      auto it = where.find(name);
      ATH_CHECK(it != where.end(), "checkpoint", "shard '", p.string(), "' holds '", name, "', which ", index_path.filename().string(),
                " does not list", Hint{"the checkpoint's index and shards do not belong together; use an earlier checkpoint"});
      ATH_CHECK(it->second == f, "checkpoint", "'", name, "' is in shard '", f, "' but ", index_path.filename().string(),
                " places it in '", it->second, "'", Hint{"the checkpoint's index and shards do not belong together"});
      seen.insert(name);
      out.tensors.emplace_back(name, std::move(t));
    }
  }
  for (const auto& [name, f] : where)
    ATH_CHECK(seen.count(name), "checkpoint", index_path.filename().string(), " places '", name, "' in '", f,
              "', which does not hold it", Hint{"the checkpoint is damaged; use an earlier one"});
  for (auto& [name, s] : sliced) {
    for (int k = 0; k < s.spec.count; ++k)
      ATH_CHECK(s.spec.real_rows(k) == 0 || s.parts[static_cast<std::size_t>(k)].defined(), "checkpoint", index_path.filename().string(),
                ": slice ", k, " of '", name, "' is missing from its shard '", s.files[static_cast<std::size_t>(k)], "'",
                Hint{"the checkpoint is damaged; use an earlier one"});
    out.tensors.emplace_back(name, dist::assemble_shards(s.parts, s.spec, s.shape, name));
  }
  out.metadata.erase("shard");
  return out;
}

}  // namespace athanor::ckpt
