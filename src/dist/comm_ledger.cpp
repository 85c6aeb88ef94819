// The process's communication ledger (contract in include/athanor/dist/comm_ledger.h).
#include "athanor/dist/comm_ledger.h"

namespace athanor::dist {

void CommTotals::add(const LedgerEntry& e) {
  ++ops;
  bytes += e.bytes;
  wire_bytes += e.wire_bytes;
  seconds += e.seconds;
}

void CommLedger::record(const LedgerEntry& e) {
  std::lock_guard<std::mutex> lock(mu_);
  totals_[e.dimension][e.op].add(e);
  if (records_.size() >= kMaxRecords) {
    // Drop the older half at once: amortised O(1) per record, totals unaffected.
    records_.erase(records_.begin(), records_.begin() + static_cast<std::ptrdiff_t>(kMaxRecords / 2));
    dropped_ += kMaxRecords / 2;
  }
  records_.push_back(e);
}

void CommLedger::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  totals_.clear();
  records_.clear();
  dropped_ = 0;
}

std::map<std::string, CommTotals> CommLedger::by_dimension() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, CommTotals> out;
  for (const auto& [dim, ops] : totals_) {
    CommTotals& t = out[dim];
    for (const auto& [op, c] : ops) {
      t.ops += c.ops;
      t.bytes += c.bytes;
      t.wire_bytes += c.wire_bytes;
      t.seconds += c.seconds;
    }
  }
  return out;
}

std::map<std::string, std::map<std::string, CommTotals>> CommLedger::by_dimension_and_op() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

std::vector<LedgerEntry> CommLedger::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

CommLedger& comm_ledger() {
  static CommLedger ledger;
  return ledger;
}

}  // namespace athanor::dist
