#pragma once
// The tensor traffic of a group of ranks on device memory: what parallel/comm.h's Comm does for host memory, for the
// activations of a GPU backend, queued on that backend's stream so that it is ordered with the kernels around it.
// parallel/nccl_comm.h implements it over NCCL. Control messages (plans, reports, the NCCL id) stay on Comm.
//
// Every call is bounded in time like Comm's: a peer that does not take part within the group's deadline makes the
// call throw RankFailure naming the group and the operation, and the group is unusable afterwards.
#include <span>

namespace strata {

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;

  virtual int rank() const = 0;  // in this group
  virtual int size() const = 0;

  // The spans are device memory (never read or written on the host).
  // data = the sum over the group's ranks.
  virtual void all_reduce_sum(std::span<float> data) = 0;
  // all[r * mine.size() ...] = rank r's `mine`, for every rank r (all.size() == size() * mine.size()).
  virtual void all_gather(std::span<const float> mine, std::span<float> all) = 0;
  // Takes `data` as it is once the work queued before it is done (the caller may overwrite it afterwards) and
  // sends it to `dest` while later work runs; messages to one rank arrive in order. Completed by wait_sends().
  virtual void send_async(std::span<const float> data, int dest) = 0;
  virtual void wait_sends() = 0;
  // Exactly data.size() floats from `src`; later work on the stream sees them.
  virtual void recv(std::span<float> data, int src) = 0;
};

}  // namespace strata
