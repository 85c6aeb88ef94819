#pragma once
// Crash-safe training checkpoints (DESIGN.md, "Files a run writes"):
//
//   <checkpoints_dir>/step-000500/ model.safetensors optimizer.safetensors state.json MANIFEST.json
//   <checkpoints_dir>/latest        the name of the newest complete checkpoint ("step-000500\n")
//
// Commit protocol (save_checkpoint): every file is written into
// "<checkpoints_dir>/.tmp.step-000500", each fsynced; MANIFEST.json (name, size
// and SHA-256 of every other file) is written last and fsynced; the directory is
// fsynced and renamed to "step-000500"; the parent is fsynced; then `latest` is
// replaced through "latest.tmp" + fsync + rename. A crash at any moment leaves
// either no step-N directory or a complete one, and `latest` always names a
// complete checkpoint (or the previous one). Invariant: only directories named
// exactly "step-<digits>" are candidates; ".tmp.*" leftovers are swept on save.
// Deletion (retention, replacing a step) first renames the directory to
// ".tmp.del.step-N", so a kill mid-delete never leaves a visible partial one.
//
// verify_checkpoint() trusts nothing: a missing manifest or file, a size or
// checksum mismatch is an Error naming the checkpoint and the file.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "athanor/ckpt/safetensors.h"
#include "athanor/dist/shard_spec.h"

namespace athanor::ckpt {

struct TensorFile {
  std::string name;  // "model.safetensors"
  NamedTensors tensors;
  std::map<std::string, std::string> metadata;
  // Sharded checkpoints (sharded_checkpoint.h): tensors that are this rank's slice of a logical
  // tensor (tensor parallelism), by name; the tensor holds the slice's real rows.
  std::map<std::string, dist::ShardSpec> slices = {};
};
struct TextFile {
  std::string name;  // "state.json"
  std::string bytes;
};

struct ManifestEntry {
  std::string name;
  uint64_t bytes = 0;
  std::string checksum;                // lowercase hex digest of the file
  std::string algorithm = "xxh3_128";  // "xxh3_128"; "sha256" in manifests written before it
};
struct Manifest {
  int64_t step = -1;
  std::vector<ManifestEntry> files;
};

std::string step_dir_name(int64_t step);               // "step-000500"
int64_t parse_step_dir_name(const std::string& name);  // 500, or -1 when not "step-<digits>"

// Writes and atomically commits checkpoint `step`; returns its directory. An
// existing directory of the same step is replaced. Updates `latest`.
std::string save_checkpoint(const std::string& checkpoints_dir, int64_t step, const std::vector<TensorFile>& tensor_files,
                            const std::vector<TextFile>& text_files);

// save_checkpoint in three parts, for checkpoints that several processes write
// (sharded_checkpoint.h): one process begins, every process writes its files into the
// directory begin returned, one process commits with every file's entry.
//   begin_checkpoint   sweeps ".tmp.*" leftovers, creates "<dir>/.tmp.step-N"; returns it
//   write_*_file       writes one file durably into that directory; returns its entry
//                      (name, bytes, XXH3-128 digest, computed by the writer)
//   commit_checkpoint  MANIFEST.json from the entries, then the renames of the protocol above
std::string begin_checkpoint(const std::string& checkpoints_dir, int64_t step);
std::string tmp_checkpoint_dir(const std::string& checkpoints_dir, int64_t step);  // what begin_checkpoint returns
ManifestEntry write_tensor_file(const std::string& dir, const TensorFile& file);
ManifestEntry write_text_file(const std::string& dir, const TextFile& file);
std::string commit_checkpoint(const std::string& checkpoints_dir, int64_t step, const std::vector<ManifestEntry>& files);

// Writes MANIFEST.json for the files of `dir` named in `files` (fsynced).
Manifest write_manifest(const std::string& dir, int64_t step, const std::vector<std::string>& files);
Manifest write_manifest(const std::string& dir, int64_t step, const std::vector<ManifestEntry>& files);
Manifest read_manifest(const std::string& dir);
// Checks every file of the manifest (exists, size, SHA-256); throws an Error naming the file.
// With `hash_file`, only the files it selects (by their index in the manifest) are hashed;
// the others are checked for existence and size (several processes split the hashing).
Manifest verify_checkpoint(const std::string& dir, const std::function<bool(std::size_t)>& hash_file = nullptr);

struct LatestCheckpoint {
  std::string path;                   // "" when there is no valid checkpoint
  int64_t step = -1;
  std::vector<std::string> skipped;   // "<dir>: <why>" for each newer checkpoint that failed verification
};
// The newest checkpoint (by step) whose manifest verifies; newer corrupt or
// partial ones are listed in `skipped`. `verify` (default verify_checkpoint) throws an
// Error for a checkpoint that must be skipped.
LatestCheckpoint find_latest_valid(const std::string& checkpoints_dir,
                                   const std::function<void(const std::string& dir)>& verify = nullptr);
// All "step-<digits>" directories, ascending by step.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& checkpoints_dir);
// The directory name `latest` holds ("" when absent).
std::string read_latest(const std::string& checkpoints_dir);

// Deletes checkpoints beyond retention: keeps the newest `keep_last` (0 = all),
// every step that is a multiple of `keep_every` (0 = none extra), and the one
// `latest` names. Returns the deleted directory names.
std::vector<std::string> apply_retention(const std::string& checkpoints_dir, int64_t keep_last, int64_t keep_every);

// fsync helpers (errors name the path).
void fsync_path(const std::string& path, bool directory);
void write_file_durable(const std::string& path, const std::string& bytes);  // write + fsync (no rename)

}  // namespace athanor::ckpt
