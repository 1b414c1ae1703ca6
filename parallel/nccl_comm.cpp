#include "parallel/nccl_comm.h"

#include <cstring>
#include <stdexcept>

#include "parallel/backoff.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

NcclComm::NcclComm(Comm& bootstrap, std::vector<std::string> names, std::string group,
                   std::shared_ptr<CommDeadline> deadline, void* stream)
    : rank_(bootstrap.rank()),
      size_(bootstrap.size()),
      names_(std::move(names)),
      group_(std::move(group)),
      deadline_(std::move(deadline)),
      stream_(static_cast<cudaStream_t>(stream)) {
  ncclUniqueId id;
  std::vector<uint8_t> bytes(sizeof(id));
  if (rank_ == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) fail(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r), "start-up");
    std::memcpy(bytes.data(), &id, sizeof(id));
  }
  bootstrap.broadcast(bytes, 0);
  if (bytes.size() != sizeof(id)) fail("the NCCL id from group rank 0 has " + std::to_string(bytes.size()) + " bytes",
                                       "start-up");
  std::memcpy(&id, bytes.data(), sizeof(id));
  check_cuda(cudaStreamCreateWithFlags(&send_stream_, cudaStreamNonBlocking), "start-up");
  check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "start-up");
  check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "start-up");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // joining, like every later call, is polled against the deadline
  settle(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "start-up (ncclCommInitRank)");
}

NcclComm::~NcclComm() {
  if (comm_ != nullptr) {
    // Abort frees the communicator without waiting on the peers (destroy would wait for them); an aborted one is
    // freed already.
    if (!aborted_) ncclCommAbort(comm_);
  }
  for (const std::vector<Staged>* list : {&in_flight_, &free_}) {
    for (const Staged& s : *list) cudaFree(s.data);
  }
  for (const Staged& s : to_self_) cudaFree(s.data);
  if (done_) cudaEventDestroy(done_);
  if (ready_) cudaEventDestroy(ready_);
  if (send_stream_) cudaStreamDestroy(send_stream_);
}

void NcclComm::fail(const std::string& reason, const char* what) {
  if (comm_ != nullptr && !aborted_) {
    ncclCommAbort(comm_);
    aborted_ = true;
  }
  throw RankFailure(std::string(what) + " over " + group_ + " (NCCL, " + names_.at(size_t(rank_)) + "): " + reason);
}

void NcclComm::check_cuda(cudaError_t code, const char* what) const {
  if (code != cudaSuccess) {
    throw RankFailure(std::string(what) + " over " + group_ + " (NCCL, " + names_.at(size_t(rank_)) +
                      "): CUDA error: " + cudaGetErrorString(code));
  }
}

void NcclComm::settle(ncclResult_t result, const char* what) {
  if (aborted_) fail("the communicator was aborted by an earlier failure", what);
  const Clock::time_point deadline = Clock::now() + deadline_->timeout;
  Backoff backoff;
  while (result == ncclInProgress) {
    if (deadline_->interrupted) fail("interrupted: this rank is shutting down", what);
    if (Clock::now() > deadline) {
      fail("a member of the group did not take part within " + std::to_string(deadline_->timeout.count()) + " ms",
           what);
    }
    backoff.pause();
    ncclCommGetAsyncError(comm_, &result);
  }
  if (result != ncclSuccess) {
    fail(std::string(ncclGetErrorString(result)) + (comm_ ? std::string(": ") + ncclGetLastError(comm_) : ""), what);
  }
}

void NcclComm::wait_stream(cudaStream_t stream, const char* what) {
  check_cuda(cudaEventRecord(done_, stream), what);
  const Clock::time_point deadline = Clock::now() + deadline_->timeout;
  Backoff backoff;
  for (;;) {
    const cudaError_t state = cudaEventQuery(done_);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) check_cuda(state, what);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      fail(std::string(ncclGetErrorString(async)) + ": " + ncclGetLastError(comm_), what);
    }
    if (deadline_->interrupted) fail("interrupted: this rank is shutting down", what);
    if (Clock::now() > deadline) {
      std::string peers;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_) peers += (peers.empty() ? "" : ", ") + names_.at(size_t(r));
      }
      fail("not done within " + std::to_string(deadline_->timeout.count()) + " ms: waiting on " + peers, what);
    }
    backoff.pause();
  }
}

void NcclComm::all_reduce_sum(std::span<float> data) {
  settle(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat32, ncclSum, comm_, stream_), "all-reduce");
  wait_stream(stream_, "all-reduce");
}

void NcclComm::all_gather(std::span<const float> mine, std::span<float> all) {
  if (all.size() != size_t(size_) * mine.size()) throw std::invalid_argument("all-gather: output size mismatch");
  settle(ncclAllGather(mine.data(), all.data(), mine.size(), ncclFloat32, comm_, stream_), "all-gather");
  wait_stream(stream_, "all-gather");
}

float* NcclComm::staging_buffer(size_t n) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->n >= n) {
      float* data = it->data;
      free_.erase(it);
      return data;
    }
  }
  void* data = nullptr;
  check_cuda(cudaMalloc(&data, n * sizeof(float)), "send");
  return static_cast<float*>(data);
}

void NcclComm::send_async(std::span<const float> data, int dest) {
  // The copy is queued on the backend's stream, behind the kernels that wrote `data`, and before any that
  // overwrite it.
  Staged staged{staging_buffer(data.size()), data.size(), dest};
  check_cuda(cudaMemcpyAsync(staged.data, data.data(), data.size_bytes(), cudaMemcpyDeviceToDevice, stream_), "send");
  if (dest == rank_) {
    to_self_.push_back(staged);
    return;
  }
  check_cuda(cudaEventRecord(ready_, stream_), "send");
  check_cuda(cudaStreamWaitEvent(send_stream_, ready_, 0), "send");
  in_flight_.push_back(staged);
  settle(ncclSend(staged.data, staged.n, ncclFloat32, dest, comm_, send_stream_), "send");
}

void NcclComm::wait_sends() {
  if (in_flight_.empty()) return;
  wait_stream(send_stream_, "send");
  free_.insert(free_.end(), in_flight_.begin(), in_flight_.end());
  in_flight_.clear();
}

void NcclComm::recv(std::span<float> data, int src) {
  if (src == rank_) {
    if (to_self_.empty() || to_self_.front().n != data.size()) {
      throw std::logic_error("recv from self: no send of " + std::to_string(data.size()) + " floats to match");
    }
    const Staged staged = to_self_.front();
    to_self_.pop_front();
    check_cuda(cudaMemcpyAsync(data.data(), staged.data, data.size_bytes(), cudaMemcpyDeviceToDevice, stream_),
               "recv");
    wait_stream(stream_, "recv");
    free_.push_back(staged);
    return;
  }
  settle(ncclRecv(data.data(), data.size(), ncclFloat32, src, comm_, stream_), "recv");
  wait_stream(stream_, "recv");
}

}  // namespace strata
