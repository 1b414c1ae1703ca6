#pragma once
// DeviceComm over NCCL (design brief, section 1): the TP group's all-reduces and the vocabulary all-gather, and the
// pipeline's hidden states, on GPU memory, queued on the CUDA backend's stream (kernels/cuda/cuda_backend.h,
// cuda_stream). Built only with the CUDA build and NCCL (STRATA_HAVE_NCCL, parallel/CMakeLists.txt).
//
// Bootstrap: the group's rank 0 calls ncclGetUniqueId and broadcasts the id over the group's MPI communicator
// (Comm::broadcast, bounded by its deadline); every rank then joins with ncclCommInitRankConfig.
//
// Bounded waits: the communicator is non-blocking (ncclConfig_t::blocking = 0), so no NCCL call blocks the host.
// After queuing an operation the host polls a CUDA event recorded behind it and ncclCommGetAsyncError until the
// event completes, an error shows, the shared deadline (parallel.timeout_s) passes, or the process is interrupted;
// in the last three cases it calls ncclCommAbort (which ends the kernels stuck on a dead peer) and throws
// RankFailure naming the group, this rank and the operation. A dead peer never hangs the world.
//
// Point-to-point sends run on a stream of their own, after an event of the backend's stream, from a device copy
// owned by the communicator: the stage computes its next micro-batch while the previous one travels. A message to
// this rank itself (a world of one) is that copy, handed to the matching recv on the stream.
//
// The reduction order is NCCL's (ring or tree), the same on every rank of a group for a given size, so all TP ranks
// hold the same activations; it is not the rank-order sum of MpiComm, so the CUDA path's sums differ from the host
// path's in the last bits.
#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "parallel/comm.h"
#include "parallel/device_comm.h"
#include "parallel/mpi_comm.h"

namespace strata {

class NcclComm final : public DeviceComm {
 public:
  // Collective over `bootstrap`'s group (every member constructs one, in the same order relative to other
  // collectives). names[r]: how to name group rank r in errors; `group` names the group ("the TP group of pp_stage
  // 1"); stream: the cudaStream_t (as void*) of the backend whose tensors it moves. The calling thread's current
  // CUDA device must be the backend's. Throws RankFailure when a member does not join within the deadline.
  NcclComm(Comm& bootstrap, std::vector<std::string> names, std::string group,
           std::shared_ptr<CommDeadline> deadline, void* stream);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(std::span<float> data) override;
  void all_gather(std::span<const float> mine, std::span<float> all) override;
  void send_async(std::span<const float> data, int dest) override;
  void wait_sends() override;
  void recv(std::span<float> data, int src) override;

 private:
  struct Staged {  // a device copy on its way to `dest`
    float* data = nullptr;
    size_t n = 0;
    int dest = 0;
  };

  // Waits until the NCCL calls just made on `comm_` are queued (non-blocking communicators may say ncclInProgress).
  void settle(ncclResult_t result, const char* what);
  // Records an event on `stream` and polls it (and NCCL's asynchronous error) until done; bounded.
  void wait_stream(cudaStream_t stream, const char* what);
  [[noreturn]] void fail(const std::string& reason, const char* what);
  void check_cuda(cudaError_t code, const char* what) const;
  float* staging_buffer(size_t n);

  int rank_ = 0;
  int size_ = 1;
  std::vector<std::string> names_;
  std::string group_;
  std::shared_ptr<CommDeadline> deadline_;
  cudaStream_t stream_ = nullptr;       // the backend's
  cudaStream_t send_stream_ = nullptr;  // point-to-point sends
  cudaEvent_t ready_ = nullptr;         // the backend's work before a send
  cudaEvent_t done_ = nullptr;          // what the host waits for
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  std::vector<Staged> in_flight_;  // sends queued since the last wait_sends (self-sends: until their recv)
  std::deque<Staged> to_self_;     // self-sends not yet received, in order
  std::vector<Staged> free_;       // staging buffers to reuse
};

}  // namespace strata
