// all_gather_strings (process_group.h): small control data between ranks as bytes.
#include <algorithm>
#include <cstring>

#include "athanor/dist/process_group.h"

namespace athanor::dist {

std::vector<std::string> all_gather_strings(ProcessGroup& g, const std::string& mine, std::source_location loc) {
  const int n = g.size();
  Tensor len = full({1}, static_cast<double>(mine.size()), {DType::i64});
  Tensor lens = empty({n}, TensorOptions(DType::i64));
  g.all_gather(lens, len, loc);
  const int64_t* pl = lens.data_ptr<int64_t>();
  const int64_t L = std::max<int64_t>(1, *std::max_element(pl, pl + n));
  Tensor in = zeros({L}, TensorOptions(DType::u8));
  if (!mine.empty()) std::memcpy(in.raw_data(), mine.data(), mine.size());
  Tensor all = empty({L * n}, TensorOptions(DType::u8));
  g.all_gather(all, in, loc);
  const char* bytes = static_cast<const char*>(all.raw_data());
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.emplace_back(bytes + r * L, static_cast<std::size_t>(pl[r]));
  return out;
}

}  // namespace athanor::dist
