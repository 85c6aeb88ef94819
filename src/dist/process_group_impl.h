#pragma once
// The insides of ProcessGroup and Work, shared by the MPI side (process_group.cpp) and the
// NCCL side (process_group_nccl.cpp). Not a public header.
#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "athanor/dist/process_group.h"
#if ATHANOR_HAS_NCCL
#include "backend/cuda/nccl_comm.h"
#endif

namespace athanor::dist {

namespace detail {
using Clock = std::chrono::steady_clock;
constexpr int kTagProbe = 7001;   // on a group's diagnosis communicator: "what did you post last?"
constexpr int kTagReply = 7002;   // answer: {last posted seq, last completed seq, world rank}
constexpr std::size_t kLedgerCap = 256;

inline std::chrono::milliseconds default_timeout() {
  if (const char* s = std::getenv("ATHANOR_DIST_TIMEOUT_S")) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end != s && v > 0) return std::chrono::milliseconds(static_cast<int64_t>(v * 1000.0));
  }
  return std::chrono::milliseconds(300'000);
}
}  // namespace detail

struct ProcessGroup::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm diag = MPI_COMM_NULL;  // duplicate of comm: timeout probes never mix with user traffic
  bool owns_comm = false;
  std::string name;
  std::string dimension;  // the mesh dimension (DeviceMesh sets it), else the name
  int rank = 0, size = 1;
  std::vector<int> world_ranks;
  std::chrono::milliseconds timeout = detail::default_timeout();
  uint64_t posted = 0, completed = 0, p2p_posted = 0;
  std::deque<LedgerEntry> ledger;
  // outstanding replies to other ranks' probes: buffer + request
  std::list<std::pair<std::array<int64_t, 3>, MPI_Request>> replies;
#if ATHANOR_HAS_NCCL
  // Set by ProcessGroup::init_nccl: CUDA tensors of this group go through it.
  std::unique_ptr<cuda::NcclComm> nccl;
#endif

  LedgerEntry& add_entry(LedgerEntry e) {
    ledger.push_back(std::move(e));
    if (ledger.size() > detail::kLedgerCap) ledger.pop_front();
    return ledger.back();
  }
  void mark_completed(const std::string& op, uint64_t seq, bool p2p, double seconds) {
    if (!p2p) completed = std::max(completed, seq);
    for (auto it = ledger.rbegin(); it != ledger.rend(); ++it)
      if (it->seq == seq && it->op == op) {
        it->completed = true;
        it->seconds = seconds;
        break;
      }
  }
  // Answers every pending probe on this group's diagnosis communicator.
  void service_probes() {
    if (diag == MPI_COMM_NULL) return;
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, detail::kTagProbe, diag, &flag, &st);
      if (!flag) break;
      int64_t asked = 0;
      MPI_Recv(&asked, 1, MPI_INT64_T, st.MPI_SOURCE, detail::kTagProbe, diag, MPI_STATUS_IGNORE);
      replies.push_back({{static_cast<int64_t>(posted), static_cast<int64_t>(completed), world_ranks[rank]}, MPI_REQUEST_NULL});
      auto& r = replies.back();
      MPI_Isend(r.first.data(), 3, MPI_INT64_T, st.MPI_SOURCE, detail::kTagReply, diag, &r.second);
    }
    for (auto it = replies.begin(); it != replies.end();) {
      int done = 0;
      MPI_Test(&it->second, &done, MPI_STATUS_IGNORE);
      it = done ? replies.erase(it) : std::next(it);
    }
  }
  // Probes the other ranks, prints which did not arrive and MPI_Aborts (process_group.h).
  [[noreturn]] void timeout_abort(const LedgerEntry& e, double waited_s);
};

struct Work::Impl {
  ProcessGroup::Impl* g = nullptr;
  // MPI: the request. NCCL: `ready` polls the operation's event instead, and `on_timeout`
  // aborts its communicator before the diagnosis (the watchdog).
  MPI_Request req = MPI_REQUEST_NULL;
  std::function<bool()> ready;
  std::function<void()> on_timeout;
  LedgerEntry entry;
  bool p2p = false;
  bool done = false;
  detail::Clock::time_point posted_at;
  std::function<void()> finish;  // after the operation completed: copy back, divide, …

  void complete();
};

namespace detail {
// A ledger entry (the group's next sequence number) and its Work, not yet posted: the caller
// posts the operation and fills req, or ready / on_timeout, and finish.
std::unique_ptr<Work::Impl> open_work(ProcessGroup::Impl& g, const char* op, std::size_t bytes, DType dt, int peer,
                                      const std::source_location& loc, bool p2p);
void check_tensor(const Tensor& t, const char* op);
#if ATHANOR_HAS_NCCL
// The NCCL forms of the operations (process_group_nccl.cpp), for CUDA tensors of a group with
// a communicator; the checks of shapes and dtypes were made by the caller.
WorkPtr nccl_all_reduce(ProcessGroup::Impl& g, const Tensor& t, ReduceOp op, const std::source_location& loc);
WorkPtr nccl_reduce_scatter(ProcessGroup::Impl& g, const Tensor& out, const Tensor& in, ReduceOp op, const std::source_location& loc);
WorkPtr nccl_all_gather(ProcessGroup::Impl& g, const Tensor& out, const Tensor& in, const std::source_location& loc);
WorkPtr nccl_broadcast(ProcessGroup::Impl& g, const Tensor& t, int root, const std::source_location& loc);
WorkPtr nccl_send(ProcessGroup::Impl& g, const Tensor& t, int dst, const std::source_location& loc);
WorkPtr nccl_recv(ProcessGroup::Impl& g, const Tensor& t, int src, const std::source_location& loc);
#endif
}  // namespace detail

}  // namespace athanor::dist
