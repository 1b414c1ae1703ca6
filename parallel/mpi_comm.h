#pragma once
// The Comm interface over MPI (Open MPI; CPU memory), and the MPI start-up of a process.
//
// Every operation is built from non-blocking point-to-point messages that the calling thread polls until a
// deadline, so that:
//   - a peer that dies or hangs is named: the call throws RankFailure saying which rank did not send or receive
//     (an MPI collective cannot say which member is missing);
//   - the wait can be interrupted (shutdown), which a blocking MPI call cannot;
//   - the all-reduce adds the ranks' contributions in rank order on every rank, so every rank of a tensor-parallel
//     group gets bitwise the same activations and takes the same sampling and compression decisions (MPI's own
//     reduction algorithms do not promise that).
// The collectives send each rank's data to every other rank: right for the small groups and the control and CPU
// tensors that MPI carries here; GPU tensors of large groups belong to NCCL.
//
// MPI is initialised for MPI_THREAD_SERIALIZED: one thread at a time makes MPI calls (the engine thread on the
// leader, the main thread on the other ranks); MPI_Abort may come from any thread.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "parallel/comm.h"

namespace strata {

// Shared by all the communicators of a process: how long a peer may take, and a switch that makes every wait
// give up (set on shutdown, from any thread).
struct CommDeadline {
  std::chrono::milliseconds timeout{60000};
  std::atomic<bool> interrupted{false};
};

class MpiComm final : public Comm {
 public:
  // Takes ownership of `comm` (freed on destruction unless MPI is finalised or aborted). names[r]: how to name
  // group rank r in errors ("rank 3 (pp_stage 1, tp_rank 0)"); `group` names the group ("the TP group of stage 1").
  MpiComm(MPI_Comm comm, std::vector<std::string> names, std::string group, std::shared_ptr<CommDeadline> deadline);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(std::span<float> data) override;
  void all_gather_bytes(std::span<const uint8_t> mine, std::span<uint8_t> all) override;
  void broadcast(std::vector<uint8_t>& bytes, int root) override;
  std::vector<std::vector<uint8_t>> gather(std::vector<uint8_t> mine, int root) override;
  void send(std::span<const float> data, int dest) override;
  void send_async(std::span<const float> data, int dest) override;
  void wait_sends() override;
  void recv(std::span<float> data, int src) override;
  void send_bytes(std::span<const uint8_t> data, int dest) override;
  std::vector<uint8_t> recv_bytes(int src) override;

 private:
  struct Pending;
  void wait(Pending& pending, const char* what);
  void check_interrupted(const char* what) const;
  std::vector<uint8_t> recv_bytes_tagged(int src, int tag, const char* what);
  void check(int code, const char* what, int peer) const;

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::string> names_;
  std::string group_;
  std::shared_ptr<CommDeadline> deadline_;
  std::vector<MPI_Request> async_sends_;  // send_async's requests until wait_sends()
  std::vector<int> async_peers_;
};

// MPI_Init_thread on construction, MPI_Finalize on destruction. Only for processes that a launcher (mpirun, srun)
// started as part of a world; a plain `strata serve` never touches MPI.
class MpiWorld {
 public:
  // The environment names a world: Open MPI's mpirun (OMPI_COMM_WORLD_SIZE) or a PMIx/PMI launcher (srun).
  static bool launched();
  MpiWorld(int* argc, char*** argv);
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // A communicator over the world ranks with the same `color`, ordered by world rank (MPI_Comm_split of a
  // duplicate of MPI_COMM_WORLD). names: of every world rank; group: how errors name the group.
  std::unique_ptr<MpiComm> split(int color, const std::vector<std::string>& names, std::string group,
                                 std::shared_ptr<CommDeadline> deadline) const;
  // Ends every process of the world (MPI_Abort) after writing `message` to stderr. Callable from any thread.
  [[noreturn]] static void abort(const std::string& message, int code = 1);

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace strata
