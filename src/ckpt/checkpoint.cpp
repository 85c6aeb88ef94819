// Checkpoint commit, manifests, verification and retention. See checkpoint.h
// for the protocol and its invariants.
#include "athanor/ckpt/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "athanor/core/error.h"
#include "ckpt/checksum.h"
#include "ckpt/safetensors_write.h"

namespace athanor::ckpt {
namespace fs = std::filesystem;

namespace {
constexpr const char* kManifest = "MANIFEST.json";
constexpr const char* kTmpPrefix = ".tmp.";

// Deletes a checkpoint directory without ever exposing a half-deleted one: it is
// first renamed (atomically) to a ".tmp." name, which is never a candidate and is
// swept by the next save, then removed.
void remove_checkpoint_dir(const fs::path& dir, std::error_code& ec) {
  const fs::path doomed = dir.parent_path() / (std::string(kTmpPrefix) + "del." + dir.filename().string());
  fs::remove_all(doomed, ec);
  fs::rename(dir, doomed, ec);
  if (ec) return;
  fs::remove_all(doomed, ec);
}
}  // namespace

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

int64_t parse_step_dir_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  ATH_CHECK(fd >= 0, "checkpoint", "cannot open '", path, "' to fsync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  ATH_CHECK(rc == 0, "checkpoint", "fsync of '", path, "' failed: ", std::strerror(err),
            Hint{"the disk may be full or failing; the checkpoint is not durable"});
}

void write_file_durable(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ATH_CHECK(fd >= 0, "checkpoint", "cannot create '", path, "': ", std::strerror(errno), Hint{"check the permissions and free space"});
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ATH_FAIL("checkpoint", "write to '", path, "' failed: ", std::strerror(err), Hint{"the disk may be full"});
    }
    done += static_cast<size_t>(n);
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  ATH_CHECK(rc == 0, "checkpoint", "fsync of '", path, "' failed: ", std::strerror(err));
}

namespace {
ManifestEntry entry_of(const std::string& dir, const std::string& name) {
  const fs::path p = fs::path(dir) / name;
  return ManifestEntry{name, static_cast<uint64_t>(fs::file_size(p)), checksum_file(Checksum::xxh3_128, p.string()),
                       checksum_name(Checksum::xxh3_128)};
}

// The manifest keys of the digest: xxh3_128 since format 2, sha256 before.
std::optional<Checksum> checksum_of(const std::string& name) {
  if (name == checksum_name(Checksum::xxh3_128)) return Checksum::xxh3_128;
  if (name == checksum_name(Checksum::sha256)) return Checksum::sha256;
  return std::nullopt;
}
}  // namespace

Manifest write_manifest(const std::string& dir, int64_t step, const std::vector<ManifestEntry>& files) {
  Manifest m;
  m.step = step;
  nlohmann::json j;
  j["format"] = "athanor-checkpoint";
  j["format_version"] = 2;  // 2: file digests are XXH3-128 ("xxh3_128"); 1 held SHA-256 ("sha256")
  j["step"] = step;
  j["files"] = nlohmann::json::array();
  std::set<std::string> seen;
  for (const auto& e : files) {
    ATH_CHECK(seen.insert(e.name).second, "checkpoint", "two files named '", e.name, "' in checkpoint '", dir, "'",
              Hint{"each process must write files of its own (sharded checkpoints name them by rank)"});
    ATH_CHECK(checksum_of(e.algorithm).has_value(), "checkpoint", "unknown checksum '", e.algorithm, "' for '", e.name, "'");
    j["files"].push_back({{"name", e.name}, {"bytes", e.bytes}, {e.algorithm, e.checksum}});
    m.files.push_back(e);
  }
  write_file_durable((fs::path(dir) / kManifest).string(), j.dump(2) + "\n");
  return m;
}

Manifest write_manifest(const std::string& dir, int64_t step, const std::vector<std::string>& files) {
  std::vector<ManifestEntry> entries;
  for (const auto& name : files) entries.push_back(entry_of(dir, name));
  return write_manifest(dir, step, entries);
}

Manifest read_manifest(const std::string& dir) {
  const fs::path p = fs::path(dir) / kManifest;
  std::ifstream f(p, std::ios::binary);
  ATH_CHECK(f.good(), "checkpoint", "'", p.string(), "' is missing: the checkpoint is partial (interrupted while saving?)",
            Hint{"use an earlier checkpoint; this one can be deleted"});
  std::stringstream ss;
  ss << f.rdbuf();
  Manifest m;
  try {
    const auto j = nlohmann::json::parse(ss.str());
    ATH_CHECK(j.value("format", "") == "athanor-checkpoint", "checkpoint", "'", p.string(), "' is not an athanor manifest");
    m.step = j.at("step").get<int64_t>();
    for (const auto& e : j.at("files")) {
      ManifestEntry me;
      me.name = e.at("name").get<std::string>();
      me.bytes = e.at("bytes").get<uint64_t>();
      for (Checksum c : {Checksum::xxh3_128, Checksum::sha256})
        if (e.contains(checksum_name(c))) me.algorithm = checksum_name(c), me.checksum = e.at(checksum_name(c)).get<std::string>();
      ATH_CHECK(!me.checksum.empty(), "checkpoint", "'", p.string(), "' gives no checksum (xxh3_128 or sha256) for '",
                me.name, "'", Hint{"the manifest is damaged or from a newer athanor; use an earlier checkpoint"});
      ATH_CHECK(!me.name.empty() && me.name.find('/') == std::string::npos && me.name != "..", "checkpoint", "'",
                p.string(), "' lists a bad file name '", me.name, "'");
      m.files.push_back(std::move(me));
    }
  } catch (const nlohmann::json::exception& e) {
    ATH_FAIL("checkpoint", "'", p.string(), "' is corrupt: ", e.what(), Hint{"use an earlier checkpoint"});
  }
  return m;
}

Manifest verify_checkpoint(const std::string& dir, const std::function<bool(std::size_t)>& hash_file) {
  ATH_CHECK(fs::is_directory(dir), "checkpoint", "'", dir, "' is not a checkpoint directory");
  Manifest m = read_manifest(dir);
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const ManifestEntry& e = m.files[i];
    const fs::path p = fs::path(dir) / e.name;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    ATH_CHECK(!ec, "checkpoint", "'", p.string(), "' is listed in the manifest but missing",
              Hint{"the checkpoint is incomplete; use an earlier one"});
    ATH_CHECK(size == e.bytes, "checkpoint", "'", p.string(), "' has ", size, " bytes but the manifest says ", e.bytes,
              " (truncated or overwritten)", Hint{"the checkpoint is damaged; use an earlier one"});
    if (hash_file && !hash_file(i)) continue;
    const std::optional<Checksum> algo = checksum_of(e.algorithm);
    ATH_CHECK(algo.has_value(), "checkpoint", "'", p.string(), "' has an unknown checksum '", e.algorithm, "'");
    const std::string sum = checksum_file(*algo, p.string());
    ATH_CHECK(sum == e.checksum, "checkpoint", "'", p.string(), "' fails its ", e.algorithm, " check (", sum, " != manifest ",
              e.checksum, "): the data is corrupt",
              Hint{"the checkpoint is damaged (disk error or edited file); use an earlier one"});
  }
  return m;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& checkpoints_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(checkpoints_dir, ec)) return out;
  for (const auto& de : fs::directory_iterator(checkpoints_dir, ec)) {
    const std::string name = de.path().filename().string();
    const int64_t s = parse_step_dir_name(name);
    if (s >= 0 && de.is_directory()) out.emplace_back(s, name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_latest(const std::string& checkpoints_dir) {
  std::ifstream f(fs::path(checkpoints_dir) / "latest");
  std::string name;
  if (f) std::getline(f, name);
  return name;
}

LatestCheckpoint find_latest_valid(const std::string& checkpoints_dir, const std::function<void(const std::string&)>& verify) {
  LatestCheckpoint r;
  auto all = list_checkpoints(checkpoints_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string dir = (fs::path(checkpoints_dir) / it->second).string();
    try {
      if (verify) verify(dir);
      else verify_checkpoint(dir);
      r.path = dir;
      r.step = it->first;
      return r;
    } catch (const Error& e) {
      r.skipped.push_back(it->second + ": " + e.what());
    }
  }
  return r;
}

std::string tmp_checkpoint_dir(const std::string& checkpoints_dir, int64_t step) {
  return (fs::path(checkpoints_dir) / (kTmpPrefix + step_dir_name(step))).string();
}

std::string begin_checkpoint(const std::string& checkpoints_dir, int64_t step) {
  std::error_code ec;
  fs::create_directories(checkpoints_dir, ec);
  ATH_CHECK(!ec, "checkpoint", "cannot create '", checkpoints_dir, "': ", ec.message(), Hint{"check out_dir and its permissions"});
  // Sweep leftovers of interrupted saves.
  std::vector<fs::path> leftovers;
  for (const auto& de : fs::directory_iterator(checkpoints_dir, ec))
    if (de.path().filename().string().rfind(kTmpPrefix, 0) == 0) leftovers.push_back(de.path());
  for (const auto& p : leftovers) fs::remove_all(p, ec);
  const std::string tmp = tmp_checkpoint_dir(checkpoints_dir, step);
  ec.clear();
  fs::create_directories(tmp, ec);
  ATH_CHECK(!ec, "checkpoint", "cannot create '", tmp, "': ", ec.message());
  return tmp;
}

ManifestEntry write_tensor_file(const std::string& dir, const TensorFile& file) {
  // Hashed from the bytes as they are written (tmp + fsync + rename inside): no second pass over the file.
  Hasher h(Checksum::xxh3_128);
  const uint64_t bytes = write_safetensors((fs::path(dir) / file.name).string(), file.tensors, file.metadata,
                                           [&h](const void* p, std::size_t n) { h.update(p, n); });
  return ManifestEntry{file.name, bytes, h.hex(), checksum_name(Checksum::xxh3_128)};
}

ManifestEntry write_text_file(const std::string& dir, const TextFile& file) {
  write_file_durable((fs::path(dir) / file.name).string(), file.bytes);
  return ManifestEntry{file.name, file.bytes.size(), checksum_hex(Checksum::xxh3_128, file.bytes.data(), file.bytes.size()),
                       checksum_name(Checksum::xxh3_128)};
}

std::string commit_checkpoint(const std::string& checkpoints_dir, int64_t step, const std::vector<ManifestEntry>& files) {
  const std::string name = step_dir_name(step);
  const fs::path tmp = tmp_checkpoint_dir(checkpoints_dir, step);
  const fs::path final_dir = fs::path(checkpoints_dir) / name;
  write_manifest(tmp.string(), step, files);
  fsync_path(tmp.string(), true);

  std::error_code ec;
  if (fs::exists(final_dir)) remove_checkpoint_dir(final_dir, ec);  // a re-save of the same step (or a damaged one)
  ec.clear();
  fs::rename(tmp, final_dir, ec);
  ATH_CHECK(!ec, "checkpoint", "cannot rename '", tmp.string(), "' to '", final_dir.string(), "': ", ec.message());
  fsync_path(checkpoints_dir, true);

  const fs::path latest_tmp = fs::path(checkpoints_dir) / "latest.tmp";
  write_file_durable(latest_tmp.string(), name + "\n");
  fs::rename(latest_tmp, fs::path(checkpoints_dir) / "latest", ec);
  ATH_CHECK(!ec, "checkpoint", "cannot update '", (fs::path(checkpoints_dir) / "latest").string(), "': ", ec.message());
  fsync_path(checkpoints_dir, true);
  return final_dir.string();
}

std::string save_checkpoint(const std::string& checkpoints_dir, int64_t step, const std::vector<TensorFile>& tensor_files,
                            const std::vector<TextFile>& text_files) {
  const std::string tmp = begin_checkpoint(checkpoints_dir, step);
  std::vector<ManifestEntry> entries;
  for (const auto& tf : tensor_files) entries.push_back(write_tensor_file(tmp, tf));
  for (const auto& tf : text_files) entries.push_back(write_text_file(tmp, tf));
  return commit_checkpoint(checkpoints_dir, step, entries);
}

std::vector<std::string> apply_retention(const std::string& checkpoints_dir, int64_t keep_last, int64_t keep_every) {
  std::vector<std::string> deleted;
  if (keep_last <= 0) return deleted;
  const auto all = list_checkpoints(checkpoints_dir);
  const std::string latest = read_latest(checkpoints_dir);
  const size_t n = all.size();
  for (size_t i = 0; i < n; ++i) {
    const auto& [step, name] = all[i];
    const bool recent = i + static_cast<size_t>(keep_last) >= n;
    const bool milestone = keep_every > 0 && step % keep_every == 0;
    if (recent || milestone || name == latest) continue;
    std::error_code ec;
    remove_checkpoint_dir(fs::path(checkpoints_dir) / name, ec);
    if (!ec) deleted.push_back(name);
  }
  if (!deleted.empty()) fsync_path(checkpoints_dir, true);
  return deleted;
}

}  // namespace athanor::ckpt
