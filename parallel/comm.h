#pragma once
// Communication within one group of ranks (the world, a stage's tensor-parallel group, or a pipeline chain):
// the collectives and point-to-point transfers the ranks need, on CPU memory. parallel/mpi_comm.h implements it
// over MPI; parallel/nccl_comm.h has the same tensor operations on GPU memory (NCCL).
//
// Every call is bounded in time: a peer that does not take part within the group's deadline makes the call throw
// RankFailure naming that peer, so a dead or hung rank never leaves the others waiting forever.
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace strata {

// A peer failed, did not answer within the deadline, or the wait was interrupted (shutdown). The message names
// the rank(s) and the operation.
class RankFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;  // in this group
  virtual int size() const = 0;

  // data = the sum over the group's ranks, bitwise identical on every rank.
  virtual void all_reduce_sum(std::span<float> data) = 0;
  // all[r * mine.size() ...] = rank r's `mine`, for every rank r (all.size() == size() * mine.size()).
  virtual void all_gather_bytes(std::span<const uint8_t> mine, std::span<uint8_t> all) = 0;
  template <typename T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    static_assert(std::is_trivially_copyable_v<T>);
    all_gather_bytes({reinterpret_cast<const uint8_t*>(mine.data()), mine.size_bytes()},
                     {reinterpret_cast<uint8_t*>(all.data()), all.size_bytes()});
  }
  // The root's bytes on every rank (any length; other ranks' input is replaced).
  virtual void broadcast(std::vector<uint8_t>& bytes, int root) = 0;
  // Rank `root` receives every other rank's bytes, indexed by rank (its own entry is empty); others send theirs.
  virtual std::vector<std::vector<uint8_t>> gather(std::vector<uint8_t> mine, int root) = 0;

  // Point to point; messages between two ranks arrive in the order they were sent.
  virtual void send(std::span<const float> data, int dest) = 0;
  // A send that returns at once: `data` must stay unchanged until wait_sends() returns. It arrives in order with
  // the other float sends to `dest`. Pipeline stages send a micro-batch this way and compute the next one while
  // it travels.
  virtual void send_async(std::span<const float> data, int dest) = 0;
  // Returns when every send_async of this communicator has completed; bounded by the deadline like every wait.
  virtual void wait_sends() = 0;
  virtual void recv(std::span<float> data, int src) = 0;  // exactly data.size() floats
  virtual void send_bytes(std::span<const uint8_t> data, int dest) = 0;
  virtual std::vector<uint8_t> recv_bytes(int src) = 0;
};

}  // namespace strata
