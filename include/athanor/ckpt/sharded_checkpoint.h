#pragma once
// Checkpoints written by every rank of a data-parallel run: each rank writes its own
// shard of every tensor file, rank 0 writes the index of each and the manifest. Tensors
// keep their logical (1-process) names, so a run saved with N ranks at any ZeRO stage
// resumes with M ranks at any other. The layout is Hugging Face's sharded safetensors:
//
//   step-000500/ model-00001-of-00004.safetensors … model-00004-of-00004.safetensors
//                model.safetensors.index.json   {"metadata": {"total_size": B}, "weight_map": {tensor: file}}
//                optimizer-00001-of-00004.safetensors … optimizer.safetensors.index.json
//                state.json  MANIFEST.json      (every file above, with its size and SHA-256)
//
// (Shard k is rank k-1's. A 1-process checkpoint holds model.safetensors and
// optimizer.safetensors instead; load_checkpoint_tensors reads either.)
//
// Tensor parallelism: a tensor split across tp ranks (TensorFile::slices) is written by each
// of them as its slice's real rows, under the logical name, in its own shard file. The index
// then lists it not in "weight_map" but in "tp_slices":
//   "tp_slices": {name: {"shape": [logical], "dim": d, "parts": p, "logical": n, "padded": m,
//                        "count": tp, "files": [the shard file of slice 0, …, of slice tp-1]}}
// ("" for a slice that holds only padding rows and so was not written). Loading merges the
// slices into the logical tensor: a checkpoint saved at any (dp, tp, ZeRO) layout reads as
// the 1-process one.
//
// save_sharded_checkpoint is a collective over `group`, in three phases, each ending in
// an agreement: (1) rank 0 begins the checkpoint (checkpoint.h: ".tmp.step-N"); (2) every
// rank writes its shards there and hashes them itself; (3) rank 0 receives every rank's
// entries, writes the indexes, the text files and the manifest, and commits. An error on
// any rank (disk full, permissions) is raised on every rank, naming the rank, and nothing
// is committed: the previous checkpoint stays `latest`. Every rank must see the same file
// system (a shared one when ranks span machines).
#include <cstdint>
#include <string>
#include <vector>

#include "athanor/ckpt/checkpoint.h"
#include "athanor/ckpt/safetensors.h"
#include "athanor/dist/process_group.h"

namespace athanor::ckpt {

std::string shard_file_name(const std::string& prefix, int index, int count);  // ("model", 0, 4) -> "model-00001-of-00004.safetensors"
std::string shard_index_name(const std::string& prefix);                       // "model.safetensors.index.json"

// `shards`: this rank's part of each tensor file, named by prefix ("model", "optimizer");
// every rank passes the same prefixes in the same order (a rank may own no tensor of one:
// its shard is then empty). `text_files`: written by rank 0 (others' are ignored).
// Returns the committed directory on every rank.
std::string save_sharded_checkpoint(dist::ProcessGroup& group, const std::string& checkpoints_dir, int64_t step,
                                    const std::vector<TensorFile>& shards, const std::vector<TextFile>& text_files);

// verify_checkpoint with the hashing split over the ranks (rank r hashes files r, r+N, …);
// a failure on any rank throws on every rank.
Manifest verify_checkpoint_across(dist::ProcessGroup& group, const std::string& dir);

// The tensors of "<dir>/<prefix>.safetensors", or of every shard its index lists, merged
// (files of 1 MiB or more are memory-mapped: a caller touches only the pages of the
// tensors it reads, so a rank loading what it owns reads about 1/N of the data; the
// tensor-parallel slices are copied into their logical tensors). The index and the shards
// must agree: each listed shard exists, each tensor is in exactly the shard the index names,
// no tensor is in two shards, every slice with real rows is present and of its shape.
SafetensorsFile load_checkpoint_tensors(const std::string& dir, const std::string& prefix);
bool has_checkpoint_tensors(const std::string& dir, const std::string& prefix);

}  // namespace athanor::ckpt
