#pragma once
// IDX files (the MNIST container format), optionally gzip-compressed:
//   bytes 0-1 zero, byte 2 the element type (0x08 = unsigned byte), byte 3 the
//   number of dimensions d, then d big-endian u32 sizes, then the elements.
// Only u8 elements are supported (all of MNIST / Fashion-MNIST). The whole file
// is read into memory; the length must match the header exactly.
#include <cstdint>
#include <string>
#include <vector>

namespace athanor::data {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // row-major, prod(dims) bytes
};

// Reads `path` (gzip or plain; zlib reads both). Errors name the file and say
// what is wrong: unreadable/corrupt gzip stream, bad magic, unexpected number of
// dimensions, truncated or oversized payload.
IdxArray read_idx_u8(const std::string& path, int expected_ndim);

// Reads a whole gzip (or plain) file into memory; an Error names the file on
// failure. `op` is used as the error's op.
std::vector<uint8_t> read_gzip_file(const std::string& path, const std::string& op);

}  // namespace athanor::data
