// `athanor inspect PATH`: what a safetensors file or a checkpoint holds, and whether it is intact.
//   a .safetensors file   metadata, then name / dtype / shape / bytes of every tensor
//   a checkpoint dir      the manifest verified file by file, state.json, then each .safetensors file
//   a run or checkpoints  every checkpoint, verified, and what `latest` names
//   directory
// Any problem (unreadable file, checksum mismatch, bad header) gives a non-zero exit.
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/ckpt/sharded_checkpoint.h"
#include "athanor/core/error.h"

namespace athanor::cli {
namespace fs = std::filesystem;

namespace {
void print_safetensors(const std::string& path) {
  const ckpt::SafetensorsFile f = ckpt::load_safetensors(path);
  std::cout << path << ": " << f.tensors.size() << " tensors\n";
  if (!f.metadata.empty()) {
    std::cout << "  metadata:\n";
    for (const auto& [k, v] : f.metadata) std::cout << "    " << k << ": " << v << "\n";
  }
  size_t wname = 4;
  for (const auto& [n, t] : f.tensors) wname = std::max(wname, n.size());
  std::cout << "  " << std::left << std::setw(static_cast<int>(wname)) << "name" << "  " << std::setw(5) << "dtype" << "  "
            << std::setw(16) << "shape" << "  bytes\n";
  uint64_t total = 0, params = 0;
  for (const auto& [n, t] : f.tensors) {
    std::cout << "  " << std::left << std::setw(static_cast<int>(wname)) << n << "  " << std::setw(5) << dtype_name(t.dtype())
              << "  " << std::setw(16) << shape_str(t.sizes()) << "  " << t.nbytes() << "\n";
    total += t.nbytes();
    params += static_cast<uint64_t>(t.numel());
  }
  std::cout << "  total: " << params << " elements, " << total << " bytes\n";
}

// Returns true when the checkpoint verifies.
bool print_checkpoint(const std::string& dir) {
  std::cout << "checkpoint " << dir << "\n";
  ckpt::Manifest m;
  try {
    m = ckpt::verify_checkpoint(dir);
  } catch (const Error& e) {
    std::cout << "  INVALID: " << e.what() << "\n";
    return false;
  }
  std::cout << "  manifest: step " << m.step << ", " << m.files.size() << " files, all verified\n";
  for (const auto& e : m.files) std::cout << "    ok  " << e.name << "  " << e.bytes << " bytes  " << e.algorithm << " " << e.checksum << "\n";
  const fs::path state = fs::path(dir) / "state.json";
  if (fs::exists(state)) {
    std::ifstream f(state);
    std::stringstream ss;
    ss << f.rdbuf();
    try {
      std::cout << "  state.json:\n";
      std::istringstream lines(nlohmann::json::parse(ss.str()).dump(2));
      for (std::string l; std::getline(lines, l);) std::cout << "    " << l << "\n";
    } catch (const nlohmann::json::exception& e) {
      std::cout << "  INVALID: " << state.string() << " is not JSON: " << e.what() << "\n";
      return false;
    }
  }
  for (const auto& e : m.files)
    if (fs::path(e.name).extension() == ".safetensors") print_safetensors((fs::path(dir) / e.name).string());
  // A data-parallel checkpoint: each rank's shard is listed above; check that the shards and
  // their index make the whole state (every tensor in exactly the shard the index names).
  for (const char* prefix : {"model", "optimizer"}) {
    if (!fs::exists(fs::path(dir) / ckpt::shard_index_name(prefix))) continue;
    try {
      const ckpt::SafetensorsFile all = ckpt::load_checkpoint_tensors(dir, prefix);
      uint64_t bytes = 0;
      for (const auto& [n, t] : all.tensors) bytes += t.nbytes();
      std::cout << prefix << " (sharded, " << ckpt::shard_index_name(prefix) << "): " << all.tensors.size()
                << " tensors, " << bytes << " bytes, index and shards agree\n";
    } catch (const Error& e) {
      std::cout << "  INVALID: " << e.what() << "\n";
      return false;
    }
  }
  return true;
}
}  // namespace

int inspect(const std::string& path) {
  ATH_CHECK(fs::exists(path), "inspect", "'", path, "' does not exist", Hint{"pass a .safetensors file or a checkpoint directory"});
  if (!fs::is_directory(path) && fs::path(path).filename() == "latest") {  // checkpoints/latest: the checkpoint it names
    const std::string name = ckpt::read_latest(fs::path(path).parent_path().string());
    std::cout << "latest: " << name << "\n";
    return print_checkpoint((fs::path(path).parent_path() / name).string()) ? 0 : 1;
  }
  if (!fs::is_directory(path)) {
    print_safetensors(path);  // throws an Error naming the file on any problem
    return 0;
  }
  if (fs::exists(fs::path(path) / "MANIFEST.json") || ckpt::parse_step_dir_name(fs::path(path).filename().string()) >= 0)
    return print_checkpoint(path) ? 0 : 1;
  std::string cdir = path;
  if (fs::is_directory(fs::path(path) / "checkpoints")) cdir = (fs::path(path) / "checkpoints").string();
  const auto all = ckpt::list_checkpoints(cdir);
  if (all.empty() && fs::exists(fs::path(path) / "model.safetensors")) {
    print_safetensors((fs::path(path) / "model.safetensors").string());
    return 0;
  }
  ATH_CHECK(!all.empty(), "inspect", "'", path, "' holds no checkpoints (step-NNNNNN directories) and no model.safetensors",
            Hint{"pass a run directory, its checkpoints/ directory, a checkpoint directory or a .safetensors file"});
  bool ok = true;
  for (const auto& [step, name] : all) {
    try {
      ckpt::verify_checkpoint((fs::path(cdir) / name).string());
      std::cout << "ok       " << name << "\n";
    } catch (const Error& e) {
      ok = false;
      std::cout << "INVALID  " << name << ": " << e.what() << "\n";
    }
  }
  const std::string latest = ckpt::read_latest(cdir);
  std::cout << "latest: " << (latest.empty() ? "(none)" : latest) << "\n";
  if (!latest.empty()) {
    try {
      ckpt::verify_checkpoint((fs::path(cdir) / latest).string());
    } catch (const Error& e) {
      ok = false;
      std::cout << "INVALID  latest names a damaged checkpoint: " << e.what() << "\n";
    }
  }
  return ok ? 0 : 1;
}

}  // namespace athanor::cli
