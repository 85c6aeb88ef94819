// token_windows: a language-model dataset over one shard. Window i covers
// tokens [i*T, i*T + T + 1): input = the first T, target = the last T (the
// input shifted by one). Windows do not overlap (except the one token a target
// shares with the next input), so an epoch sees every token once.
#include "athanor/core/error.h"
#include "athanor/data/token_shard.h"

namespace athanor::data {
namespace {

class TokenWindows final : public Dataset {
 public:
  TokenWindows(std::shared_ptr<TokenShard> shard, int64_t block_size) : shard_(std::move(shard)), T_(block_size) {
    ATH_CHECK(shard_ != nullptr, "token_windows", "the shard is null", Hint{"open it with std::make_shared<TokenShard>(path, vocab_size)"});
    ATH_CHECK(T_ > 0, "token_windows", "block_size must be positive, got ", T_, Hint{"set the model's context length, e.g. 1024"});
    count_ = shard_->size() > 0 ? (shard_->size() - 1) / T_ : 0;
    ATH_CHECK(count_ > 0, "token_windows", shard_->path(), " has ", shard_->size(), " tokens, too few for one window of block_size ",
              T_, " (needs ", T_ + 1, ")", Hint{"use a smaller block_size or more text"});
  }

  int64_t size() const override { return count_; }

  Sample get(int64_t index) const override {
    check_index(index);
    Sample s;
    s.input = empty({T_}, DType::i64);
    s.target = empty({T_}, DType::i64);
    write_window(index, s.input.data_ptr<int64_t>(), s.target.data_ptr<int64_t>());
    return s;
  }

  // The batch filled in place: rows of one [N, T] input and one [N, T] target.
  std::optional<Batch> get_batch(const std::vector<int64_t>& ids) const override {
    ATH_CHECK(!ids.empty(), "token_windows", "no indices for a batch of ", describe(), Hint{"a batch needs at least one sample"});
    for (int64_t id : ids) check_index(id);
    const auto n = static_cast<int64_t>(ids.size());
    Batch b;
    b.input = empty({n, T_}, DType::i64);
    b.target = empty({n, T_}, DType::i64);
    int64_t* x = b.input.data_ptr<int64_t>();
    int64_t* y = b.target.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) write_window(ids[i], x + i * T_, y + i * T_);
    b.sample_ids = ids;
    b.num_targets = n * T_;  // token ids are >= 0, never the ignore index
    return b;
  }

  std::string describe() const override {
    return "token windows of " + shard_->path() + " (" + std::to_string(count_) + " windows of " + std::to_string(T_) + " tokens)";
  }

 private:
  void check_index(int64_t index) const {
    ATH_CHECK(index >= 0 && index < count_, "token_windows", "window ", index, " is out of range for ", describe(),
              Hint{"valid indices are 0 .. size()-1"});
  }
  void write_window(int64_t index, int64_t* x, int64_t* y) const {
    const int64_t start = index * T_;
    int64_t prev = (*shard_)[start];
    for (int64_t t = 0; t < T_; ++t) {
      const int64_t cur = (*shard_)[start + t + 1];
      x[t] = prev;
      y[t] = cur;
      prev = cur;
    }
  }

  std::shared_ptr<TokenShard> shard_;
  int64_t T_;
  int64_t count_ = 0;
};

}  // namespace

std::shared_ptr<Dataset> token_windows(std::shared_ptr<TokenShard> shard, int64_t block_size) {
  return std::make_shared<TokenWindows>(std::move(shard), block_size);
}

}  // namespace athanor::data
