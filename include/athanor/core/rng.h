#pragma once
// Counter-based random numbers: Philox 4x32-10 (Salmon et al., SC'11), the
// generator cuRAND and PyTorch use. Output block i is a pure function of
// (seed, counter = offset + i), so filling a tensor in parallel gives the same
// values whatever the number of threads, and a generator's whole state is two
// integers (seed, offset) that a checkpoint can save.
#include <array>
#include <cstdint>
#include <mutex>

#include "athanor/core/tensor.h"

namespace athanor {

// One Philox4x32-10 block: 4 uniformly distributed 32-bit words.
std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter, uint64_t stream = 0);
inline float uint_to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * 0x1.0p-24f; }  // [0, 1)

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // next unused Philox block
  bool operator==(const GeneratorState&) const = default;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}
  void manual_seed(uint64_t seed);
  GeneratorState state() const;
  void set_state(const GeneratorState& s);
  // Reserves `blocks` consecutive Philox blocks and returns (seed, first counter).
  GeneratorState reserve(uint64_t blocks);

 private:
  mutable std::mutex mu_;
  GeneratorState state_;
};

Generator& default_generator();
void manual_seed(uint64_t seed);  // seeds the default generator

// Fill in place (any floating dtype), consuming blocks from `gen`.
Tensor& uniform_(Tensor& t, double lo = 0.0, double hi = 1.0, Generator& gen = default_generator());
Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator& gen = default_generator());
Tensor rand(const Shape& shape, const TensorOptions& opts = {}, Generator& gen = default_generator());
Tensor randn(const Shape& shape, const TensorOptions& opts = {}, Generator& gen = default_generator());
// Uniform integers in [lo, hi).
Tensor randint(int64_t lo, int64_t hi, const Shape& shape, Generator& gen = default_generator());

}  // namespace athanor
