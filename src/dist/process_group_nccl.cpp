// The NCCL side of ProcessGroup: the operations on CUDA tensors of a group that has an NCCL
// communicator (contract in include/athanor/dist/process_group.h, stream order in
// src/backend/cuda/nccl_comm.h). Compiled empty in a build without NCCL.
#include "dist/process_group_impl.h"

#if ATHANOR_HAS_NCCL

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "athanor/core/error.h"

namespace athanor::dist::detail {

namespace {

cuda::NcclReduce nccl_reduce(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return cuda::NcclReduce::sum;
    case ReduceOp::avg: return cuda::NcclReduce::avg;
    case ReduceOp::max: return cuda::NcclReduce::max;
  }
  return cuda::NcclReduce::sum;
}

// t itself when contiguous, else a contiguous copy on its device (queued on the compute
// stream, so before the communication stream's wait).
Tensor device_staged(const Tensor& t, bool copy_values) {
  if (t.is_contiguous()) return t;
  Tensor s = empty(t.sizes(), TensorOptions(t.dtype()).with_device(t.device()).with_tag(MemTag::workspace));
  if (copy_values) copy_into(s, t);
  return s;
}

// The watchdog's first act: ncclCommAbort, so that the communicator's kernels stop spinning.
// On a thread of its own with a bounded wait: an abort that blocks (behind device work that
// never ends) must not keep the rank from its diagnosis and MPI_Abort, which end the process.
void abort_for_watchdog(cuda::NcclComm& c, const std::string& group) {
  std::fprintf(stderr, "[athanor.dist] collective timed out: aborting the NCCL communicator of group %s (ncclCommAbort)\n",
               group.c_str());
  std::fflush(stderr);
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread([&c, done] {
    try {
      c.abort();
    } catch (...) {
    }
    done->store(true);
  }).detach();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done->load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!done->load()) std::fprintf(stderr, "[athanor.dist] ncclCommAbort did not return within 5 s; going on with the diagnosis\n");
}

// Fills the Work of an enqueued NCCL operation: readiness is its event; the finish orders the
// compute stream after it, then runs `then` (copies back into a non-contiguous tensor: queued
// on the compute stream, so after the operation); the watchdog aborts the communicator. The
// tensors live in the closures until the operation completed (a buffer the communication
// stream still reads is never handed back to the allocator).
WorkPtr finish_work(std::unique_ptr<Work::Impl> w, cuda::NcclComm& comm, std::unique_ptr<cuda::NcclOp> op,
                    std::function<void()> then) {
  std::shared_ptr<cuda::NcclOp> shared = std::move(op);
  cuda::NcclComm* c = &comm;
  w->ready = [c, shared] { return c->done(*shared); };
  w->on_timeout = [c, group = w->entry.group] { abort_for_watchdog(*c, group); };
  w->finish = [c, shared, then = std::move(then)] {
    c->finish(*shared);
    if (then) then();
  };
  return std::make_shared<Work>(std::move(w));
}

}  // namespace

WorkPtr nccl_all_reduce(ProcessGroup::Impl& g, const Tensor& t, ReduceOp op, const std::source_location& loc) {
  Tensor buf = device_staged(t, true);
  auto w = open_work(g, "all_reduce", t.nbytes(), t.dtype(), -1, loc, false);
  auto o = g.nccl->all_reduce(buf.device_data(), buf.device_data(), buf.numel(), buf.dtype(), nccl_reduce(op));
  return finish_work(std::move(w), *g.nccl, std::move(o), [t, buf] {
    if (!buf.is_same(t)) copy_into(t, buf);
    t.bump_version();
  });
}

WorkPtr nccl_reduce_scatter(ProcessGroup::Impl& g, const Tensor& out, const Tensor& in, ReduceOp op, const std::source_location& loc) {
  Tensor ibuf = device_staged(in, true), obuf = device_staged(out, false);
  auto w = open_work(g, "reduce_scatter", in.nbytes(), in.dtype(), -1, loc, false);
  auto o = g.nccl->reduce_scatter(ibuf.device_data(), obuf.device_data(), obuf.numel(), obuf.dtype(), nccl_reduce(op));
  return finish_work(std::move(w), *g.nccl, std::move(o), [out, ibuf, obuf] {
    if (!obuf.is_same(out)) copy_into(out, obuf);
    out.bump_version();
  });
}

WorkPtr nccl_all_gather(ProcessGroup::Impl& g, const Tensor& out, const Tensor& in, const std::source_location& loc) {
  Tensor ibuf = device_staged(in, true), obuf = device_staged(out, false);
  auto w = open_work(g, "all_gather", out.nbytes(), in.dtype(), -1, loc, false);
  auto o = g.nccl->all_gather(ibuf.device_data(), obuf.device_data(), ibuf.numel(), ibuf.dtype());
  return finish_work(std::move(w), *g.nccl, std::move(o), [out, ibuf, obuf] {
    if (!obuf.is_same(out)) copy_into(out, obuf);
    out.bump_version();
  });
}

WorkPtr nccl_broadcast(ProcessGroup::Impl& g, const Tensor& t, int root, const std::source_location& loc) {
  Tensor buf = device_staged(t, g.rank == root);
  auto w = open_work(g, "broadcast", t.nbytes(), t.dtype(), root, loc, false);
  auto o = g.nccl->broadcast(buf.device_data(), buf.numel(), buf.dtype(), root);
  return finish_work(std::move(w), *g.nccl, std::move(o), [t, buf] {
    if (!buf.is_same(t)) copy_into(t, buf);
    t.bump_version();
  });
}

WorkPtr nccl_send(ProcessGroup::Impl& g, const Tensor& t, int dst, const std::source_location& loc) {
  Tensor buf = device_staged(t, true);
  auto w = open_work(g, "send", t.nbytes(), t.dtype(), dst, loc, true);
  auto o = g.nccl->send(buf.device_data(), buf.numel(), buf.dtype(), dst);
  return finish_work(std::move(w), *g.nccl, std::move(o), [buf] {});
}

WorkPtr nccl_recv(ProcessGroup::Impl& g, const Tensor& t, int src, const std::source_location& loc) {
  Tensor buf = device_staged(t, false);
  auto w = open_work(g, "recv", t.nbytes(), t.dtype(), src, loc, true);
  auto o = g.nccl->recv(buf.device_data(), buf.numel(), buf.dtype(), src);
  return finish_work(std::move(w), *g.nccl, std::move(o), [t, buf] {
    if (!buf.is_same(t)) copy_into(t, buf);
    t.bump_version();
  });
}

}  // namespace athanor::dist::detail

#endif  // ATHANOR_HAS_NCCL
