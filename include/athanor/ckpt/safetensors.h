#pragma once
// safetensors (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets":
// [begin, end]}, "__metadata__": {string: string}} padded with spaces to a
// multiple of 8, then the raw little-endian row-major data (offsets relative to
// the start of the data block). Dtypes: F64 F32 F16 BF16 I64 I32 U16 U8 BOOL
// (U16 loads as i32: athanor has no u16 tensors).
//
// The reader trusts nothing: header length bounds, JSON well-formedness, known
// dtypes, non-negative shapes, byte lengths equal to numel x element size,
// offsets inside the file, entries tiling the data block with no gap or overlap,
// no duplicate names. Every failure is an Error naming the file and the entry.
// The writer writes to "<path>.tmp", fsyncs, and renames over `path`.
//
// Files of kSafetensorsMmapThreshold bytes or more are memory-mapped (private,
// copy-on-write) and their tensors view the map without copying when the entry
// is suitably aligned (U16 and misaligned entries are copied out of the map);
// the map lives as long as any such tensor. Smaller files are read() whole.
// (A mapped file truncated by another process while its tensors live would
// raise SIGBUS on access; checkpoints are never rewritten in place.)
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "athanor/core/tensor.h"

namespace athanor::ckpt {

inline constexpr std::size_t kSafetensorsMmapThreshold = std::size_t{1} << 20;

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct SafetensorsFile {
  NamedTensors tensors;  // in file order (sorted by offset)
  std::map<std::string, std::string> metadata;
  const Tensor* find(const std::string& name) const;
};

// Tensors may live on any device: a device tensor's bytes are copied out a piece (16 MiB) at a
// time as they are written, so saving a model on a GPU holds no host copy of it (nor of any
// one tensor); load_safetensors_into uploads into device destinations the same way.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});
SafetensorsFile load_safetensors(const std::string& path);
// Parses bytes already in memory (`source` names them in errors); the tensors
// own copies. The same validation as load_safetensors (the fuzz target's entry).
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& source);
// Reads a file straight into existing tensors (one copy from the page cache, as
// read() makes): the same header validation, then every name in `dst` must be in
// the file with the same dtype and shape (and the file must hold nothing else);
// each destination must be contiguous. Names, dtypes and shapes are all checked before
// any byte is written (BOOL entries are checked for 0/1 as they land).
// How a checkpoint is restored into a model that already has its parameters.
void load_safetensors_into(const std::string& path, const NamedTensors& dst);

}  // namespace athanor::ckpt
