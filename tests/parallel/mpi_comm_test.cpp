// MpiComm between real ranks. Run under mpirun (tests/parallel/test_mpi_comm.py: mpirun -np 3 parallel_tests
// --gtest_filter='MpiComm*'); started alone, as ctest does, the tests skip.
#include "parallel/mpi_comm.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

struct Group {
  std::unique_ptr<MpiWorld> world;
  std::shared_ptr<CommDeadline> deadline = std::make_shared<CommDeadline>();
  std::unique_ptr<MpiComm> comm;
};

// One MPI world for the whole test process (MPI_Init once; MPI_Finalize at exit).
Group* group() {
  if (!MpiWorld::launched()) return nullptr;
  static Group g = [] {
    Group x;
    x.world = std::make_unique<MpiWorld>(nullptr, nullptr);
    std::vector<std::string> names;
    for (int r = 0; r < x.world->size(); ++r) names.push_back("rank " + std::to_string(r));
    // Rank 0 gives up on a silent peer after 3 s; the others wait for it longer than that.
    x.deadline->timeout = std::chrono::milliseconds(x.world->rank() == 0 ? 3000 : 10000);
    x.comm = x.world->split(0, names, "the test group", x.deadline);
    return x;
  }();
  return &g;
}

#define NEED_A_WORLD()                                                    \
  Group* g = group();                                                     \
  if (g == nullptr || g->comm->size() < 2) GTEST_SKIP() << "run under mpirun -np 2 or more"; \
  MpiComm& comm = *g->comm

TEST(MpiComm, AllReduceAddsInRankOrderAndEveryRankGetsTheSameBits) {
  NEED_A_WORLD();
  const int n = comm.size();
  // Values whose float sum depends on the order: only the rank-order sum is the expected one.
  auto value_of = [](int rank, int i) { return rank % 2 == 0 ? 1e8f + float(i) : 0.3f + float(rank) * 1e-3f; };
  std::vector<float> data(1000);
  for (int i = 0; i < 1000; ++i) data[size_t(i)] = value_of(comm.rank(), i);
  comm.all_reduce_sum(data);
  for (int i = 0; i < 1000; i += 97) {
    float want = value_of(0, i);
    for (int r = 1; r < n; ++r) want += value_of(r, i);
    EXPECT_EQ(data[size_t(i)], want) << i;
  }
  // Every rank holds the same bits: gather them all and compare.
  std::vector<float> all(data.size() * size_t(n));
  comm.all_gather<float>(data, all);
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(0, std::memcmp(all.data(), all.data() + size_t(r) * data.size(), data.size() * sizeof(float))) << r;
  }
}

TEST(MpiComm, BroadcastGatherAndPointToPoint) {
  NEED_A_WORLD();
  const int n = comm.size(), me = comm.rank();
  std::vector<uint8_t> bytes;
  if (me == 0) bytes.assign(100000, 7);  // larger than any eager limit
  comm.broadcast(bytes, 0);
  EXPECT_EQ(bytes, std::vector<uint8_t>(100000, 7));

  std::vector<std::vector<uint8_t>> got = comm.gather(std::vector<uint8_t>(size_t(me) * 3, uint8_t(me)), 0);
  if (me == 0) {
    ASSERT_EQ(int(got.size()), n);
    for (int r = 1; r < n; ++r) EXPECT_EQ(got[size_t(r)], std::vector<uint8_t>(size_t(r) * 3, uint8_t(r))) << r;
  }

  // A ring: everyone sends to the next and receives from the previous.
  std::vector<float> out(5000, float(me)), in(5000, -1.0f);
  if (me % 2 == 0) {
    comm.send(out, (me + 1) % n);
    comm.recv(in, (me + n - 1) % n);
  } else {
    comm.recv(in, (me + n - 1) % n);
    comm.send(out, (me + 1) % n);
  }
  EXPECT_EQ(in, std::vector<float>(5000, float((me + n - 1) % n)));
}

// Pipeline micro-batches: every rank starts two large sends to the next before receiving anything; blocking sends
// of that size (past the eager limit) would wait on each other forever.
TEST(MpiComm, AsyncSendsLeaveAtOnceAndArriveInOrder) {
  NEED_A_WORLD();
  const int n = comm.size(), me = comm.rank();
  std::vector<float> first(100000, float(me)), second(100000, float(me) + 0.5f);
  comm.send_async(first, (me + 1) % n);
  comm.send_async(second, (me + 1) % n);
  std::vector<float> in(100000);
  comm.recv(in, (me + n - 1) % n);
  EXPECT_EQ(in, std::vector<float>(100000, float((me + n - 1) % n)));
  comm.recv(in, (me + n - 1) % n);
  EXPECT_EQ(in, std::vector<float>(100000, float((me + n - 1) % n) + 0.5f));
  comm.wait_sends();
  comm.wait_sends();  // nothing left: returns at once
}

TEST(MpiComm, APeerThatDoesNotAnswerIsNamedWithinTheDeadline) {
  NEED_A_WORLD();
  if (comm.rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> in(4);
    try {
      comm.recv(in, 1);  // rank 1 never sends
      ADD_FAILURE() << "recv from a silent rank returned";
    } catch (const RankFailure& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 did not answer within 3 s (recv over the test group"),
                std::string::npos)
          << e.what();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(waited, 3.0);
    EXPECT_LT(waited, 6.0);
  }
  // Nobody leaves before rank 0 is done waiting: the next collective would otherwise meet its recv.
  std::vector<uint8_t> done(1, 1);
  comm.broadcast(done, 0);
}

}  // namespace
}  // namespace strata
