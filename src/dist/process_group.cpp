// ProcessGroup over an MPI communicator: nonblocking collectives with a
// per-group sequence number, a ledger, a deadline on every wait, and the
// timeout diagnosis (see include/athanor/dist/process_group.h for the contract).
// CUDA tensors go through the group's NCCL communicator when it has one
// (process_group_nccl.cpp), else through MPI with host staging (here).
#include "athanor/dist/process_group.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iomanip>
#include <list>
#include <mutex>
#include <sstream>
#include <thread>
#include <type_traits>

#include "athanor/core/error.h"
#include "athanor/dist/comm_ledger.h"
#include "dist/process_group_impl.h"
#if ATHANOR_HAS_CUDA
#include "backend/cuda/runtime.h"
#endif

namespace athanor::dist {

namespace {
using detail::Clock;
using detail::kTagProbe;
using detail::kTagReply;

bool g_initialized = false;
bool g_we_initialized = false;
int g_thread_level = MPI_THREAD_SINGLE;
std::shared_ptr<ProcessGroup> g_world;
std::vector<ProcessGroup::Impl*> g_groups;  // live groups: their diagnosis communicators are serviced while waiting

std::string call_site(const std::source_location& loc) {
  std::string f = loc.file_name();
  // keep the last two path components: "dist/ddp.cpp"
  auto p = f.rfind('/');
  if (p != std::string::npos && p > 0) {
    auto q = f.rfind('/', p - 1);
    if (q != std::string::npos) f = f.substr(q + 1);
  }
  std::ostringstream os;
  os << f << ":" << loc.line();
  return os.str();
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;  // data movement only; reductions are staged in f32
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::boolean: return MPI_C_BOOL;
  }
  return MPI_BYTE;
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  ATH_FAIL("dist", what, " failed: ", std::string(buf, len));
}

void check_init(const char* op) {
  ATH_CHECK(g_initialized, op, "MPI is not initialised", Hint{"call athanor::dist::init_from_mpi() first and start the program with mpirun"});
}

}  // namespace


namespace {
void service_all_probes() {
  for (auto* g : g_groups) g->service_probes();
}

std::string describe_entry(const LedgerEntry& e) {
  std::ostringstream os;
  os << e.op << " #" << e.seq << " on group " << e.group << " (bytes " << e.bytes << ", " << dtype_name(e.dtype);
  if (e.peer >= 0) os << (e.op == "broadcast" ? ", root " : ", peer ") << e.peer;
  os << ", called at " << e.call_site << ")";
  if (!e.context.empty()) os << ": " << e.context;
  return os.str();
}
}  // namespace

void ProcessGroup::Impl::timeout_abort(const LedgerEntry& e, double waited_s) {
  const bool p2p = e.op == "send" || e.op == "recv";
  std::vector<int> not_arrived;
  std::vector<std::string> details;
  if (p2p) {
    not_arrived.push_back(e.peer);
  } else {
    // Probe every other rank; its own deadline, short next to the collective's.
    const auto probe_budget = std::clamp(timeout / 4, std::chrono::milliseconds(500), std::chrono::milliseconds(10'000));
    std::vector<int64_t> ask(size, static_cast<int64_t>(e.seq));
    std::vector<std::array<int64_t, 3>> answer(size);
    std::vector<MPI_Request> sreq(size, MPI_REQUEST_NULL), rreq(size, MPI_REQUEST_NULL);
    std::vector<bool> got(size, false);
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      MPI_Irecv(answer[r].data(), 3, MPI_INT64_T, r, kTagReply, diag, &rreq[r]);
      MPI_Isend(&ask[r], 1, MPI_INT64_T, r, kTagProbe, diag, &sreq[r]);
    }
    got[rank] = true;
    answer[rank] = {static_cast<int64_t>(posted), static_cast<int64_t>(completed), world_ranks[rank]};
    const auto deadline = Clock::now() + probe_budget;
    for (;;) {
      bool all = true;
      for (int r = 0; r < size; ++r) {
        if (got[r]) continue;
        int flag = 0;
        MPI_Test(&rreq[r], &flag, MPI_STATUS_IGNORE);
        if (flag) got[r] = true; else all = false;
      }
      service_all_probes();  // other ranks that timed out probe us too
      if (all || Clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const double budget_s = probe_budget.count() / 1000.0;
    for (int r = 0; r < size; ++r) {
      std::ostringstream os;
      if (!got[r]) {
        not_arrived.push_back(r);
        os << "  rank " << r << " (world " << world_ranks[r] << "): no answer to the probe within " << budget_s
           << "s (busy outside any collective, hung or dead)";
        details.push_back(os.str());
      } else if (answer[r][0] < static_cast<int64_t>(e.seq)) {
        not_arrived.push_back(r);
        os << "  rank " << r << " (world " << world_ranks[r] << "): waiting in a collective of another group; last posted #"
           << answer[r][0] << " on this group";
        details.push_back(os.str());
      }
    }
  }
  std::ostringstream msg;
  msg << "[athanor.dist rank " << world_ranks[rank] << "] " << (p2p ? "transfer " : "collective ") << describe_entry(e) << " timed out after "
      << std::fixed << std::setprecision(1) << waited_s << "s; ranks not arrived: [";
  for (std::size_t i = 0; i < not_arrived.size(); ++i) msg << (i ? ", " : "") << not_arrived[i];
  msg << "]\n";
  for (auto& d : details) msg << d << "\n";
  if (!p2p && not_arrived.empty())
    msg << "  every rank posted #" << e.seq << ": the ranks called different collectives (op, size or order); compare the ledgers\n";
  msg << "  last operations of this rank:\n";
  const std::size_t first = ledger.size() > 5 ? ledger.size() - 5 : 0;
  for (std::size_t i = first; i < ledger.size(); ++i)
    msg << "    " << describe_entry(ledger[i]) << (ledger[i].completed ? " done" : " PENDING") << "\n";
  if (p2p)
    msg << "hint: the peer did not " << (e.op == "recv" ? "send" : "receive") << " it in time: it is dead, hung, slower than the "
        << "timeout, or running another schedule; set the timeout with ATHANOR_DIST_TIMEOUT_S, dist.timeout_s or "
           "ProcessGroup::set_timeout. Aborting every rank (MPI_Abort).\n";
  else
    msg << "hint: every rank of a group must call the same collectives in the same order; set the timeout with "
           "ATHANOR_DIST_TIMEOUT_S or ProcessGroup::set_timeout. Aborting every rank (MPI_Abort).\n";
  const std::string s = msg.str();
  std::fwrite(s.data(), 1, s.size(), stderr);
  std::fflush(stderr);
  std::fflush(stdout);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}


void Work::Impl::complete() {
  done = true;
  entry.completed = true;
  entry.seconds = std::chrono::duration<double>(Clock::now() - posted_at).count();
  g->mark_completed(entry.op, entry.seq, p2p, entry.seconds);
  comm_ledger().record(entry);
  if (finish) finish();
  finish = nullptr;  // drops the tensors it kept alive
}

Work::Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Work::~Work() {
  if (impl_ && !impl_->done) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
      try { wait(); } catch (...) {}
    }
  }
}
bool Work::completed() const { return impl_->done; }
void Work::set_context(std::string context) { impl_->entry.context = std::move(context); }
uint64_t Work::seq() const { return impl_->entry.seq; }
const std::string& Work::op() const { return impl_->entry.op; }

bool Work::test() {
  if (impl_->done) return true;
  int flag = 0;
  if (impl_->ready) flag = impl_->ready();
  else check_mpi(MPI_Test(&impl_->req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
  if (flag) impl_->complete();
  return impl_->done;
}

void Work::wait() {
  if (impl_->done) return;
  const auto start = Clock::now();
  const auto deadline = start + impl_->g->timeout;
  int spins = 0;
  for (;;) {
    int flag = 0;
    if (impl_->ready) flag = impl_->ready();  // NCCL: the operation's event
    else check_mpi(MPI_Test(&impl_->req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) break;
    service_all_probes();
    const auto now = Clock::now();
    if (now > deadline) {
      // The watchdog: an NCCL communicator is aborted first (its kernels would otherwise spin on
      // the device for ever), then the ranks are probed over MPI as for an MPI collective.
      if (impl_->on_timeout) impl_->on_timeout();
      impl_->g->timeout_abort(impl_->entry, std::chrono::duration<double>(now - start).count());
    }
    // spin briefly for latency, then back off (ranks are often oversubscribed on the cores)
    if (++spins < 200) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(spins < 2000 ? 20 : 200));
  }
  impl_->complete();
}

// ---------------------------------------------------------------------------
namespace {

std::shared_ptr<ProcessGroup> make_group(MPI_Comm comm, std::string name, bool owns) {
  auto impl = std::make_unique<ProcessGroup::Impl>();
  impl->comm = comm;
  impl->owns_comm = owns;
  impl->name = std::move(name);
  impl->dimension = impl->name;
  MPI_Comm_rank(comm, &impl->rank);
  MPI_Comm_size(comm, &impl->size);
  MPI_Comm_dup(comm, &impl->diag);
  MPI_Group wg, gg;
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Comm_group(comm, &gg);
  std::vector<int> mine(impl->size);
  for (int i = 0; i < impl->size; ++i) mine[i] = i;
  impl->world_ranks.resize(impl->size);
  MPI_Group_translate_ranks(gg, impl->size, mine.data(), wg, impl->world_ranks.data());
  MPI_Group_free(&wg);
  MPI_Group_free(&gg);
  g_groups.push_back(impl.get());
  return std::make_shared<ProcessGroup>(std::move(impl));
}

bool reducible(DType dt) { return dt != DType::boolean; }

// A contiguous host tensor of dtype `dt` holding t's values (t itself when it already is
// one). A CUDA tensor is staged on the host (MPI moves host memory): copy_into downloads it
// after the work queued on its compute stream (the kernels that wrote it), through the
// device's pinned staging buffers, and the finish of the operation uploads the result,
// ordered before the work queued on the compute stream afterwards.
Tensor staged(const Tensor& t, DType dt, bool copy_values) {
  if (t.device().is_cpu() && t.is_contiguous() && t.dtype() == dt) return t;
  Tensor s = empty(t.sizes(), TensorOptions(dt).with_tag(MemTag::workspace));
  if (copy_values) copy_into(s, t);
  return s;
}

void divide_by(const Tensor& t, int n) {
  if (n == 1) return;
  dispatch(t.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                  (std::is_integral_v<T> && !std::is_same_v<T, bool>)) {
      T* p = static_cast<T*>(t.raw_data());
      const int64_t k = t.numel();
      for (int64_t i = 0; i < k; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(n));
    } else {
      ATH_ASSERT(false);
    }
  });
}

DType reduce_dtype(DType dt) { return is_low_precision(dt) ? DType::f32 : dt; }
MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  ATH_CHECK(a.device() == b.device(), op, "output ", a.describe(), " is on ", a.device().str(), " and input ", b.describe(),
            " on ", b.device().str(), Hint{"put both tensors of a collective on one device"});
}

#if ATHANOR_HAS_NCCL
// The group's NCCL communicator takes t when t is a CUDA tensor and the group has one.
bool on_nccl(const ProcessGroup::Impl& g, const Tensor& t, const char* op) {
  if (!g.nccl || t.device().is_cpu()) return false;
  ATH_CHECK(t.device().index == g.nccl->device(), op, "group ", g.name, " has its NCCL communicator on cuda:", g.nccl->device(),
            " but got ", t.describe(), " on ", t.device().str(), Hint{"one process drives one GPU: keep its tensors on that device"});
  return true;
}
#endif

}  // namespace

namespace detail {
void check_tensor(const Tensor& t, const char* op) {
  ATH_CHECK(t.defined(), op, "got an undefined tensor");
  // CPU tensors go through MPI; CUDA tensors through NCCL or MPI with host staging.
}
}  // namespace detail

namespace {
using detail::check_tensor;

}  // namespace

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
namespace {
// Frees what a group holds inside MPI (its pending reply requests, its communicators); the
// group stays an object, unusable for collectives.
void release_mpi_resources(ProcessGroup::Impl& impl) {
  for (auto& r : impl.replies) MPI_Request_free(&r.second);
  impl.replies.clear();
#if ATHANOR_HAS_NCCL
  impl.nccl.reset();  // before MPI_Finalize and before the CUDA runtime goes at exit
#endif
  if (impl.diag != MPI_COMM_NULL) MPI_Comm_free(&impl.diag);
  if (impl.owns_comm && impl.comm != MPI_COMM_NULL) MPI_Comm_free(&impl.comm);
  impl.diag = impl.comm = MPI_COMM_NULL;
}
}  // namespace

ProcessGroup::~ProcessGroup() {
  std::erase(g_groups, impl_.get());
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) release_mpi_resources(*impl_);
}
int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
const std::string& ProcessGroup::name() const { return impl_->name; }
const std::string& ProcessGroup::dimension() const { return impl_->dimension; }
void ProcessGroup::set_dimension(std::string dim) { impl_->dimension = std::move(dim); }
std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key, std::string name) {
  check_init("ProcessGroup::split");
  MPI_Comm c;
  check_mpi(MPI_Comm_split(impl_->comm, color, key, &c), "MPI_Comm_split");
  auto g = make_group(c, std::move(name), true);
#if ATHANOR_HAS_NCCL
  // Every rank of this group called split, so every rank of the new group reaches this too.
  if (impl_->nccl) g->init_nccl(impl_->nccl->device());
#endif
  return g;
}

void ProcessGroup::init_nccl(int device) {
  check_init("ProcessGroup::init_nccl");
#if ATHANOR_HAS_NCCL
  if (impl_->nccl) {
    ATH_CHECK(impl_->nccl->device() == device, "ProcessGroup::init_nccl", "group ", impl_->name,
              " already has an NCCL communicator on cuda:", impl_->nccl->device(), ", not cuda:", device,
              Hint{"one process drives one GPU"});
    return;
  }
  cuda::check_device(device, "ProcessGroup::init_nccl");
  // The bootstrap over MPI: rank 0's unique id, broadcast on this group's communicator (with
  // the group's timeout and ledger entry, like any collective).
  cuda::NcclId id{};
  if (impl_->rank == 0) id = cuda::nccl_unique_id();
  Tensor bytes = empty({static_cast<int64_t>(id.size())}, TensorOptions(DType::u8).with_tag(MemTag::workspace));
  std::memcpy(bytes.raw_data(), id.data(), id.size());
  broadcast(bytes, 0);
  std::memcpy(id.data(), bytes.raw_data(), id.size());
  impl_->nccl = std::make_unique<cuda::NcclComm>(id, impl_->size, impl_->rank, device);
#else
  ATH_FAIL("ProcessGroup::init_nccl", "group ", impl_->name, ": this build has no NCCL (cuda:", device, " requested)",
           Hint{"build with CUDA and NCCL (nccl.h and libnccl beside the CUDA toolkit), or use dist.backend mpi (host staging)"});
#endif
}

bool ProcessGroup::uses_nccl() const {
#if ATHANOR_HAS_NCCL
  return impl_->nccl != nullptr;
#else
  return false;
#endif
}

void ProcessGroup::release_nccl() {
#if ATHANOR_HAS_NCCL
  impl_->nccl.reset();
#endif
}

std::string ProcessGroup::backend_for(const Tensor& t) const {
  if (t.device().is_cpu()) return "mpi";
  return uses_nccl() ? "nccl" : "mpi (host staging)";
}
int ProcessGroup::world_rank_of(int r) const { return impl_->world_ranks.at(r); }
void ProcessGroup::set_timeout(std::chrono::milliseconds t) { impl_->timeout = t; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->timeout; }
uint64_t ProcessGroup::last_posted_seq() const { return impl_->posted; }
uint64_t ProcessGroup::last_completed_seq() const { return impl_->completed; }
std::vector<LedgerEntry> ProcessGroup::ledger() const { return {impl_->ledger.begin(), impl_->ledger.end()}; }

namespace {
// What a ring implementation moves per rank (NCCL's bus bytes; comm_ledger.h).
double wire_bytes(const std::string& op, std::size_t bytes, int n) {
  const double b = static_cast<double>(bytes), frac = n > 1 ? static_cast<double>(n - 1) / n : 0.0;
  if (op == "all_reduce") return 2.0 * frac * b;
  if (op == "all_gather" || op == "reduce_scatter") return frac * b;
  if (op == "barrier") return 0;
  return n > 1 ? b : 0.0;  // broadcast, send, recv
}

}  // namespace

std::unique_ptr<Work::Impl> detail::open_work(ProcessGroup::Impl& g, const char* op, std::size_t bytes, DType dt, int peer,
                                              const std::source_location& loc, bool p2p) {
  check_init(op);
  auto w = std::make_unique<Work::Impl>();
  w->g = &g;
  w->p2p = p2p;
  LedgerEntry e;
  e.seq = p2p ? ++g.p2p_posted : ++g.posted;
  e.op = op;
  e.group = g.name;
  e.dimension = g.dimension;
  e.group_size = g.size;
  e.bytes = bytes;
  e.wire_bytes = wire_bytes(op, bytes, g.size);
  e.dtype = dt;
  e.peer = peer;
  e.call_site = call_site(loc);
  w->entry = g.add_entry(e);
  w->posted_at = Clock::now();
  return w;
}

namespace {
// Posts one operation: ledger entry, MPI call (which fills the request), Work.
template <class Post>
WorkPtr post(ProcessGroup::Impl& g, const char* op, std::size_t bytes, DType dt, int peer, const std::source_location& loc,
             bool p2p, Post&& post_fn, std::function<void()> finish) {
  auto w = detail::open_work(g, op, bytes, dt, peer, loc, p2p);
  w->finish = std::move(finish);
  check_mpi(post_fn(&w->req), op);
  return std::make_shared<Work>(std::move(w));
}
}  // namespace

WorkPtr ProcessGroup::all_reduce_async(const Tensor& t, ReduceOp op, Loc loc) {
  check_tensor(t, "all_reduce");
  ATH_CHECK(reducible(t.dtype()), "all_reduce", "cannot reduce a ", dtype_name(t.dtype()), " tensor");
#if ATHANOR_HAS_NCCL
  if (on_nccl(*impl_, t, "all_reduce")) return detail::nccl_all_reduce(*impl_, t, op, loc);
#endif
  Tensor buf = staged(t, reduce_dtype(t.dtype()), true);
  const int n = impl_->size;
  return post(*impl_, "all_reduce", t.nbytes(), t.dtype(), -1, loc, false,
              [&](MPI_Request* r) {
                return MPI_Iallreduce(MPI_IN_PLACE, buf.raw_data(), static_cast<int>(buf.numel()), mpi_type(buf.dtype()),
                                      mpi_op(op), impl_->comm, r);
              },
              [t, buf, op, n] {
                if (op == ReduceOp::avg) divide_by(buf, n);
                if (!buf.is_same(t)) copy_into(t, buf);
                t.bump_version();
              });
}

WorkPtr ProcessGroup::reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op, Loc loc) {
  check_tensor(out, "reduce_scatter");
  check_tensor(in, "reduce_scatter");
  ATH_CHECK(reducible(in.dtype()), "reduce_scatter", "cannot reduce a ", dtype_name(in.dtype()), " tensor");
  ATH_CHECK(in.dtype() == out.dtype(), "reduce_scatter", "input ", in.describe(), " and output ", out.describe(), " differ in dtype");
  ATH_CHECK(in.numel() == out.numel() * impl_->size, "reduce_scatter", "input ", in.describe(), " must hold group size (",
            impl_->size, ") x output ", out.describe(), " elements");
  check_same_device(out, in, "reduce_scatter");
#if ATHANOR_HAS_NCCL
  if (on_nccl(*impl_, in, "reduce_scatter")) return detail::nccl_reduce_scatter(*impl_, out, in, op, loc);
#endif
  const DType rd = reduce_dtype(in.dtype());
  Tensor ibuf = staged(in, rd, true), obuf = staged(out, rd, false);
  const int n = impl_->size;
  return post(*impl_, "reduce_scatter", in.nbytes(), in.dtype(), -1, loc, false,
              [&](MPI_Request* r) {
                return MPI_Ireduce_scatter_block(ibuf.raw_data(), obuf.raw_data(), static_cast<int>(obuf.numel()),
                                                 mpi_type(rd), mpi_op(op), impl_->comm, r);
              },
              [out, ibuf, obuf, op, n] {
                if (op == ReduceOp::avg) divide_by(obuf, n);
                if (!obuf.is_same(out)) copy_into(out, obuf);
                out.bump_version();
              });
}

WorkPtr ProcessGroup::all_gather_async(const Tensor& out, const Tensor& in, Loc loc) {
  check_tensor(out, "all_gather");
  check_tensor(in, "all_gather");
  ATH_CHECK(in.dtype() == out.dtype(), "all_gather", "input ", in.describe(), " and output ", out.describe(), " differ in dtype");
  ATH_CHECK(out.numel() == in.numel() * impl_->size, "all_gather", "output ", out.describe(), " must hold group size (",
            impl_->size, ") x input ", in.describe(), " elements");
  check_same_device(out, in, "all_gather");
#if ATHANOR_HAS_NCCL
  if (on_nccl(*impl_, in, "all_gather")) return detail::nccl_all_gather(*impl_, out, in, loc);
#endif
  Tensor ibuf = staged(in, in.dtype(), true), obuf = staged(out, out.dtype(), false);
  return post(*impl_, "all_gather", out.nbytes(), in.dtype(), -1, loc, false,
              [&](MPI_Request* r) {
                return MPI_Iallgather(ibuf.raw_data(), static_cast<int>(ibuf.numel()), mpi_type(in.dtype()), obuf.raw_data(),
                                      static_cast<int>(ibuf.numel()), mpi_type(in.dtype()), impl_->comm, r);
              },
              [out, ibuf, obuf] {
                if (!obuf.is_same(out)) copy_into(out, obuf);
                out.bump_version();
              });
}

WorkPtr ProcessGroup::broadcast_async(const Tensor& t, int root, Loc loc) {
  check_tensor(t, "broadcast");
  ATH_CHECK(root >= 0 && root < impl_->size, "broadcast", "root ", root, " is not a rank of group ", impl_->name, " (size ", impl_->size, ")");
#if ATHANOR_HAS_NCCL
  if (on_nccl(*impl_, t, "broadcast")) return detail::nccl_broadcast(*impl_, t, root, loc);
#endif
  Tensor buf = staged(t, t.dtype(), impl_->rank == root);
  return post(*impl_, "broadcast", t.nbytes(), t.dtype(), root, loc, false,
              [&](MPI_Request* r) {
                return MPI_Ibcast(buf.raw_data(), static_cast<int>(buf.numel()), mpi_type(t.dtype()), root, impl_->comm, r);
              },
              [t, buf] {
                if (!buf.is_same(t)) copy_into(t, buf);
                t.bump_version();
              });
}

WorkPtr ProcessGroup::send_async(const Tensor& t, int dst, int tag, Loc loc) {
  check_tensor(t, "send");
  ATH_CHECK(dst >= 0 && dst < impl_->size && dst != impl_->rank, "send", "bad destination rank ", dst, " in group ", impl_->name);
#if ATHANOR_HAS_NCCL
  if (on_nccl(*impl_, t, "send")) return detail::nccl_send(*impl_, t, dst, loc);  // NCCL matches in posting order, not by tag
#endif
  Tensor buf = staged(t, t.dtype(), true);
  return post(*impl_, "send", t.nbytes(), t.dtype(), dst, loc, true,
              [&](MPI_Request* r) {
                return MPI_Isend(buf.raw_data(), static_cast<int>(buf.numel()), mpi_type(t.dtype()), dst, tag, impl_->comm, r);
              },
              [buf] {});
}

WorkPtr ProcessGroup::recv_async(const Tensor& t, int src, int tag, Loc loc) {
  check_tensor(t, "recv");
  ATH_CHECK(src >= 0 && src < impl_->size && src != impl_->rank, "recv", "bad source rank ", src, " in group ", impl_->name);
#if ATHANOR_HAS_NCCL
  if (on_nccl(*impl_, t, "recv")) return detail::nccl_recv(*impl_, t, src, loc);
#endif
  Tensor buf = staged(t, t.dtype(), false);
  return post(*impl_, "recv", t.nbytes(), t.dtype(), src, loc, true,
              [&](MPI_Request* r) {
                return MPI_Irecv(buf.raw_data(), static_cast<int>(buf.numel()), mpi_type(t.dtype()), src, tag, impl_->comm, r);
              },
              [t, buf] {
                if (!buf.is_same(t)) copy_into(t, buf);
                t.bump_version();
              });
}

WorkPtr ProcessGroup::barrier_async(Loc loc) {
  return post(*impl_, "barrier", 0, DType::u8, -1, loc, false,
              [&](MPI_Request* r) { return MPI_Ibarrier(impl_->comm, r); }, nullptr);
}

// ---------------------------------------------------------------------------
const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

std::shared_ptr<ProcessGroup> init_from_mpi(int* argc, char*** argv) {
  if (g_initialized) return g_world;
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    int provided = MPI_THREAD_SINGLE;
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    g_we_initialized = true;
  }
  MPI_Query_thread(&g_thread_level);
  g_initialized = true;
  g_world = make_group(MPI_COMM_WORLD, "world", false);
  return g_world;
}

bool is_initialized() { return g_initialized; }

void finalize() {
  if (!g_initialized) return;
  g_world.reset();
  int fin = 0;
  MPI_Finalized(&fin);
  // Groups still alive (a mesh kept in a static, say) give their communicators back now:
  // after MPI_Finalize nothing can free them.
  if (!fin)
    for (ProcessGroup::Impl* impl : g_groups) release_mpi_resources(*impl);
  if (!fin && g_we_initialized) MPI_Finalize();
  g_initialized = false;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::automatic: return "auto";
    case Backend::mpi: return "mpi";
    case Backend::nccl: return "nccl";
  }
  return "?";
}

bool nccl_built() {
#if ATHANOR_HAS_NCCL
  return true;
#else
  return false;
#endif
}

std::string nccl_version() {
#if ATHANOR_HAS_NCCL
  return cuda::nccl_version_string();
#else
  return "";
#endif
}

namespace {
// The GPU's UUID ("" when the device does not exist or the build has no CUDA).
std::string gpu_uuid(Device device) {
#if ATHANOR_HAS_CUDA
  if (device.is_cpu() || device.index >= cuda::device_count()) return "";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device.index) != cudaSuccess) return "";
  static const char* hex = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    const auto b = static_cast<unsigned char>(p.uuid.bytes[i]);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
#else
  (void)device;
  return "";
#endif
}
}  // namespace

Backend resolve_backend(Backend requested, Device device) {
  if (requested == Backend::mpi) return Backend::mpi;
  if (device.is_cpu()) {
    ATH_CHECK(requested != Backend::nccl, "dist.backend", "nccl moves CUDA tensors, and this run's tensors are on the CPU",
              Hint{"use dist.backend mpi (or auto) for CPU training, or trainer.device cuda with nccl"});
    return Backend::mpi;
  }
  if (!nccl_built()) {
    ATH_CHECK(requested != Backend::nccl, "dist.backend", "nccl was asked for, but this build has no NCCL",
              Hint{"build with CUDA and NCCL (nccl.h and libnccl beside the CUDA toolkit), or use dist.backend mpi: "
                   "CUDA tensors then go through MPI with host staging"});
    return Backend::mpi;
  }
  // One GPU of its own per process: the GPUs the ranks drive, by UUID (a per-rank
  // CUDA_VISIBLE_DEVICES makes every process see "cuda:0", on different GPUs), all different.
  const std::string mine = gpu_uuid(device);
  const std::vector<std::string> all =
      is_initialized() ? all_gather_strings(*world(), mine) : std::vector<std::string>{mine};
  std::string why;
  for (std::size_t r = 0; r < all.size() && why.empty(); ++r) {
    if (all[r].empty()) why = "rank " + std::to_string(r) + " has no " + device.str();
    for (std::size_t q = 0; q < r && why.empty(); ++q)
      if (all[q] == all[r]) why = "ranks " + std::to_string(q) + " and " + std::to_string(r) + " drive the same GPU (" + all[r] + ")";
  }
  if (why.empty()) return Backend::nccl;
  ATH_CHECK(requested != Backend::nccl, "dist.backend", "nccl needs one GPU of its own per process (NCCL refuses two ranks on one "
            "GPU), and ", why, Hint{"start at most one process per GPU, or use dist.backend mpi (host staging) to share a GPU"});
  return Backend::mpi;
}

int rank() {
  check_init("dist::rank");
  return g_world->rank();
}
int world_size() {
  check_init("dist::world_size");
  return g_world->size();
}
int local_rank() {
  check_init("dist::local_rank");
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) return std::atoi(s);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}
int local_size() {
  check_init("dist::local_size");
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::atoi(s);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}
const char* thread_level_name() {
  switch (g_thread_level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "?";
}
std::shared_ptr<ProcessGroup> world() {
  check_init("dist::world");
  return g_world;
}

}  // namespace athanor::dist
