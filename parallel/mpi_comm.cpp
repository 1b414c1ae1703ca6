#include "parallel/mpi_comm.h"

#include <cstdlib>
#include <iostream>

#include "parallel/backoff.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

// One tag per kind of message, so that a collective never matches a point-to-point message between the same
// two ranks of a group.
enum Tag : int { kTagFloats = 1, kTagBytes = 2, kTagReduce = 3, kTagGather = 4, kTagBroadcast = 5 };

// "4 s", "2.5 s".
std::string seconds_text(std::chrono::milliseconds t) {
  const long long ms = t.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s"
                        : std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + " s";
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, size_t(length));
}

}  // namespace

// Requests in flight, each with the group rank at the other end (for the error message).
struct MpiComm::Pending {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  Clock::time_point deadline;

  void add(MPI_Request r, int peer) {
    requests.push_back(r);
    peers.push_back(peer);
  }
};

MpiComm::MpiComm(MPI_Comm comm, std::vector<std::string> names, std::string group,
                 std::shared_ptr<CommDeadline> deadline)
    : comm_(comm), names_(std::move(names)), group_(std::move(group)), deadline_(std::move(deadline)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // errors come back as codes and become RankFailure
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

void MpiComm::check(int code, const char* what, int peer) const {
  if (code == MPI_SUCCESS) return;
  throw RankFailure(std::string(what) + " over " + group_ + (peer >= 0 ? " with " + names_.at(size_t(peer)) : "") +
                    ": MPI error: " + mpi_error_text(code));
}

void MpiComm::check_interrupted(const char* what) const {
  if (deadline_->interrupted) {
    throw RankFailure(std::string(what) + " over " + group_ + ": interrupted: " + names_.at(size_t(rank_)) +
                      " is shutting down");
  }
}

void MpiComm::wait(Pending& pending, const char* what) {
  std::vector<bool> done(pending.requests.size(), false);
  size_t n_left = pending.requests.size();
  Backoff backoff;
  while (n_left > 0) {
    for (size_t i = 0; i < pending.requests.size(); ++i) {
      if (done[i]) continue;
      int flag = 0;
      MPI_Status status;
      check(MPI_Test(&pending.requests[i], &flag, &status), what, pending.peers[i]);
      if (flag) {
        done[i] = true;
        --n_left;
      }
    }
    if (n_left == 0) return;
    check_interrupted(what);
    if (Clock::now() > pending.deadline) {
      std::string late;
      for (size_t i = 0; i < done.size(); ++i) {
        if (done[i]) continue;
        const std::string& name = names_.at(size_t(pending.peers[i]));
        if (late.find(name) == std::string::npos) late += (late.empty() ? "" : ", ") + name;
      }
      throw RankFailure(late + " did not answer within " + seconds_text(deadline_->timeout) + " (" + what + " over " +
                        group_ + ", waiting on " + names_.at(size_t(rank_)) + ")");
    }
    backoff.pause();
  }
}

void MpiComm::all_reduce_sum(std::span<float> data) {
  if (size_ == 1) return;
  const int n = int(data.size());
  std::vector<float> parts(size_t(size_) * data.size());
  Pending pending{{}, {}, Clock::now() + deadline_->timeout};
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request req;
    check(MPI_Irecv(parts.data() + size_t(r) * data.size(), n, MPI_FLOAT, r, kTagReduce, comm_, &req), "all-reduce", r);
    pending.add(req, r);
    check(MPI_Isend(data.data(), n, MPI_FLOAT, r, kTagReduce, comm_, &req), "all-reduce", r);
    pending.add(req, r);
  }
  wait(pending, "all-reduce");
  std::copy(data.begin(), data.end(), parts.begin() + ptrdiff_t(size_t(rank_) * data.size()));
  // The same additions in the same order on every rank: bitwise equal sums.
  for (size_t i = 0; i < data.size(); ++i) {
    float sum = parts[i];
    for (int r = 1; r < size_; ++r) sum += parts[size_t(r) * data.size() + i];
    data[i] = sum;
  }
}

void MpiComm::all_gather_bytes(std::span<const uint8_t> mine, std::span<uint8_t> all) {
  if (all.size() != size_t(size_) * mine.size()) throw std::invalid_argument("all-gather: output size mismatch");
  std::copy(mine.begin(), mine.end(), all.begin() + ptrdiff_t(size_t(rank_) * mine.size()));
  if (size_ == 1) return;
  const int n = int(mine.size());
  Pending pending{{}, {}, Clock::now() + deadline_->timeout};
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request req;
    check(MPI_Irecv(all.data() + size_t(r) * mine.size(), n, MPI_BYTE, r, kTagGather, comm_, &req), "all-gather", r);
    pending.add(req, r);
    check(MPI_Isend(mine.data(), n, MPI_BYTE, r, kTagGather, comm_, &req), "all-gather", r);
    pending.add(req, r);
  }
  wait(pending, "all-gather");
}

void MpiComm::broadcast(std::vector<uint8_t>& bytes, int root) {
  if (size_ == 1) return;
  if (rank_ != root) {
    bytes = recv_bytes_tagged(root, kTagBroadcast, "broadcast");
    return;
  }
  Pending pending{{}, {}, Clock::now() + deadline_->timeout};
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request req;
    check(MPI_Isend(bytes.data(), int(bytes.size()), MPI_BYTE, r, kTagBroadcast, comm_, &req), "broadcast", r);
    pending.add(req, r);
  }
  wait(pending, "broadcast");
}

std::vector<std::vector<uint8_t>> MpiComm::gather(std::vector<uint8_t> mine, int root) {
  std::vector<std::vector<uint8_t>> out;
  if (rank_ != root) {
    send_bytes(mine, root);
    return out;
  }
  out.resize(size_t(size_));
  // Probe every sender until its message is matched, then receive them all; the ones still missing at the
  // deadline are named. The root waits twice as long as any rank waits for a peer, so that a rank that is itself
  // stuck on a failed peer reports that failure (naming the peer) before the root gives up on it.
  const Clock::time_point deadline = Clock::now() + 2 * deadline_->timeout;
  Pending pending{{}, {}, deadline};
  std::vector<int> unmatched;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) unmatched.push_back(r);
  }
  Backoff backoff;
  while (!unmatched.empty()) {
    for (auto it = unmatched.begin(); it != unmatched.end();) {
      int flag = 0;
      MPI_Message message;
      MPI_Status status;
      check(MPI_Improbe(*it, kTagBytes, comm_, &flag, &message, &status), "gather", *it);
      if (!flag) {
        ++it;
        continue;
      }
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      out[size_t(*it)].resize(size_t(count));
      MPI_Request req;
      check(MPI_Imrecv(out[size_t(*it)].data(), count, MPI_BYTE, &message, &req), "gather", *it);
      pending.add(req, *it);
      it = unmatched.erase(it);
    }
    if (unmatched.empty()) break;
    check_interrupted("gather");
    if (Clock::now() > deadline) {
      std::string late;
      for (int r : unmatched) late += (late.empty() ? "" : ", ") + names_.at(size_t(r));
      throw RankFailure(late + " did not answer within " + seconds_text(2 * deadline_->timeout) + " (gather over " +
                        group_ + ")");
    }
    backoff.pause();
  }
  wait(pending, "gather");
  return out;
}

void MpiComm::send(std::span<const float> data, int dest) {
  Pending pending{{}, {}, Clock::now() + deadline_->timeout};
  MPI_Request req;
  check(MPI_Isend(data.data(), int(data.size()), MPI_FLOAT, dest, kTagFloats, comm_, &req), "send", dest);
  pending.add(req, dest);
  wait(pending, "send");
}

void MpiComm::send_async(std::span<const float> data, int dest) {
  MPI_Request req;
  check(MPI_Isend(data.data(), int(data.size()), MPI_FLOAT, dest, kTagFloats, comm_, &req), "send", dest);
  async_sends_.push_back(req);
  async_peers_.push_back(dest);
}

void MpiComm::wait_sends() {
  Pending pending{std::move(async_sends_), std::move(async_peers_), Clock::now() + deadline_->timeout};
  async_sends_.clear();
  async_peers_.clear();
  wait(pending, "send");
}

void MpiComm::recv(std::span<float> data, int src) {
  Pending pending{{}, {}, Clock::now() + deadline_->timeout};
  MPI_Request req;
  check(MPI_Irecv(data.data(), int(data.size()), MPI_FLOAT, src, kTagFloats, comm_, &req), "recv", src);
  pending.add(req, src);
  wait(pending, "recv");
}

void MpiComm::send_bytes(std::span<const uint8_t> data, int dest) {
  Pending pending{{}, {}, Clock::now() + deadline_->timeout};
  MPI_Request req;
  check(MPI_Isend(data.data(), int(data.size()), MPI_BYTE, dest, kTagBytes, comm_, &req), "send", dest);
  pending.add(req, dest);
  wait(pending, "send");
}

std::vector<uint8_t> MpiComm::recv_bytes(int src) { return recv_bytes_tagged(src, kTagBytes, "recv"); }

std::vector<uint8_t> MpiComm::recv_bytes_tagged(int src, int tag, const char* what) {
  Pending pending{{}, {}, Clock::now() + deadline_->timeout};
  Backoff backoff;
  MPI_Message message;
  MPI_Status status;
  for (;;) {
    int flag = 0;
    check(MPI_Improbe(src, tag, comm_, &flag, &message, &status), what, src);
    if (flag) break;
    check_interrupted(what);
    if (Clock::now() > pending.deadline) {
      throw RankFailure(names_.at(size_t(src)) + " sent nothing within " + seconds_text(deadline_->timeout) + " (" +
                        what + " over " + group_ +
                        ", waiting on " + names_.at(size_t(rank_)) + ")");
    }
    backoff.pause();
  }
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  std::vector<uint8_t> bytes(static_cast<size_t>(count));
  MPI_Request req;
  check(MPI_Imrecv(bytes.data(), count, MPI_BYTE, &message, &req), what, src);
  pending.add(req, src);
  wait(pending, what);
  return bytes;
}

bool MpiWorld::launched() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

MpiWorld::MpiWorld(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    abort("strata: the MPI library provides thread level " + std::to_string(provided) +
          "; MPI_THREAD_SERIALIZED is needed (the leader's engine thread makes the MPI calls)");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiWorld::~MpiWorld() { MPI_Finalize(); }

std::unique_ptr<MpiComm> MpiWorld::split(int color, const std::vector<std::string>& names, std::string group,
                                         std::shared_ptr<CommDeadline> deadline) const {
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, color, rank_, &comm);
  // The split keeps world order, so group rank i is the i-th world rank with this color.
  std::vector<int> colors(static_cast<size_t>(size_));
  MPI_Allgather(&color, 1, MPI_INT, colors.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<std::string> group_names;
  for (int r = 0; r < size_; ++r) {
    if (colors[size_t(r)] == color) group_names.push_back(names.at(size_t(r)));
  }
  return std::make_unique<MpiComm>(comm, std::move(group_names), std::move(group), std::move(deadline));
}

void MpiWorld::abort(const std::string& message, int code) {
  std::cerr << message << std::endl;
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps the promise if it ever did
}

}  // namespace strata
