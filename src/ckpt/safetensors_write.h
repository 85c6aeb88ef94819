#pragma once
// save_safetensors (athanor/ckpt/safetensors.h) with the file's digest taken from the bytes
// as they are written, so that a checkpoint's manifest needs no second pass over the file.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "athanor/ckpt/safetensors.h"

namespace athanor::ckpt {

// Writes `path` as save_safetensors does (tmp file, fsync, rename) and hands every byte to
// `sink` (may be empty) in file order. Returns the file's size.
using ByteSink = std::function<void(const void* data, std::size_t n)>;
uint64_t write_safetensors(const std::string& path, const NamedTensors& tensors,
                           const std::map<std::string, std::string>& metadata, const ByteSink& sink);

}  // namespace athanor::ckpt
