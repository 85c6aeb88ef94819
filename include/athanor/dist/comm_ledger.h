#pragma once
// The communication ledger: every collective and point-to-point transfer this process
// completed (ProcessGroup reports each one when it completes), with its op, group, mesh
// dimension, bytes and time, summed per dimension and per (dimension, op).
//
//   dist::comm_ledger().reset();                 // e.g. at the start of a training step
//   … forward, backward, reductions …
//   for (auto& [dim, t] : dist::comm_ledger().by_dimension())
//     std::cout << dim << ": " << t.ops << " ops, " << t.bytes << " B in " << t.seconds << " s\n";
//
// Invariants:
//  - the totals count every operation completed since the last reset(), exactly; the list
//    of records keeps at most kMaxRecords of them (the oldest are dropped first);
//  - bytes and wire_bytes are those of the ProcessGroup's LedgerEntry (process_group.h):
//    the tensor's size, and what a ring implementation moves per rank;
//  - seconds run from posting to completion as this rank saw it: for an asynchronous
//    operation (DDP's buckets during backward) that includes the overlap with compute, so
//    the per-dimension seconds are an upper bound on the time spent communicating.
// Thread safety: a mutex guards the ledger (MPI itself is driven from one thread).
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "athanor/dist/process_group.h"

namespace athanor::dist {

struct CommTotals {
  int64_t ops = 0;
  uint64_t bytes = 0;
  double wire_bytes = 0;
  double seconds = 0;
  void add(const LedgerEntry& e);
};

class CommLedger {
 public:
  static constexpr std::size_t kMaxRecords = 1 << 16;
  void record(const LedgerEntry& e);  // a completed operation
  void reset();                       // forget everything recorded so far
  std::map<std::string, CommTotals> by_dimension() const;
  std::map<std::string, std::map<std::string, CommTotals>> by_dimension_and_op() const;  // dimension -> op -> totals
  std::vector<LedgerEntry> records() const;  // since reset, oldest first (at most kMaxRecords)

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::map<std::string, CommTotals>> totals_;
  std::vector<LedgerEntry> records_;
  std::size_t dropped_ = 0;
};

CommLedger& comm_ledger();  // this process's

}  // namespace athanor::dist
