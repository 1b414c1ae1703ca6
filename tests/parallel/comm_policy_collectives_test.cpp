// The policies' collectives over a group, with a scripted Comm standing in for the other ranks (the MPI transport
// itself is tested under mpirun: mpi_comm_test.cpp).
#include "parallel/comm_policy_collectives.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

// Rank `rank` of a group whose other members' all_gather contributions are given in advance.
class ScriptedComm final : public Comm {
 public:
  ScriptedComm(int rank, std::vector<std::vector<double>> contributions)
      : rank_(rank), contributions_(std::move(contributions)) {}
  int rank() const override { return rank_; }
  int size() const override { return int(contributions_.size()); }
  void all_gather_bytes(std::span<const uint8_t> mine, std::span<uint8_t> all) override {
    ASSERT_EQ(all.size(), mine.size() * contributions_.size());
    for (size_t r = 0; r < contributions_.size(); ++r) {
      const uint8_t* src = int(r) == rank_ ? mine.data() : reinterpret_cast<const uint8_t*>(contributions_[r].data());
      std::memcpy(all.data() + r * mine.size(), src, mine.size());
    }
  }
  void all_reduce_sum(std::span<float>) override { throw std::logic_error("not scripted"); }
  void broadcast(std::vector<uint8_t>&, int) override { throw std::logic_error("not scripted"); }
  std::vector<std::vector<uint8_t>> gather(std::vector<uint8_t>, int) override { throw std::logic_error("no"); }
  void send(std::span<const float>, int) override { throw std::logic_error("not scripted"); }
  void send_async(std::span<const float>, int) override { throw std::logic_error("not scripted"); }
  void wait_sends() override { throw std::logic_error("not scripted"); }
  void recv(std::span<float>, int) override { throw std::logic_error("not scripted"); }
  void send_bytes(std::span<const uint8_t>, int) override { throw std::logic_error("not scripted"); }
  std::vector<uint8_t> recv_bytes(int) override { throw std::logic_error("not scripted"); }

 private:
  int rank_;
  std::vector<std::vector<double>> contributions_;
};

TEST(CommPolicyCollectives, TpAllReduceSumsMinsAndMaxesOverTheGroup) {
  // SimLayerKV's parts of one layer on 3 tensor ranks: (mass, heads).
  ScriptedComm tp(1, {{0.9, 3.0}, {0.0, 0.0}, {2.4, 3.0}});
  CommPolicyCollectives c(&tp, nullptr, 30);
  std::vector<double> v = {1.5, 3.0};
  c.tp_all_reduce(v, ReduceOp::sum);
  EXPECT_EQ(v, (std::vector<double>{0.9 + 1.5 + 2.4, 9.0}));
  v = {1.5, 3.0};
  c.tp_all_reduce(v, ReduceOp::min);
  EXPECT_EQ(v, (std::vector<double>{0.9, 3.0}));
  v = {1.5, 3.0};
  c.tp_all_reduce(v, ReduceOp::max);
  EXPECT_EQ(v, (std::vector<double>{2.4, 3.0}));
}

TEST(CommPolicyCollectives, GatherLayersTakesEachLayerFromTheStageThatOwnsIt) {
  // 7 layers over 3 stages: [0, 3), [3, 5), [5, 7). This rank is stage 1; the others filled only their layers.
  const double nan = std::nan("");
  ScriptedComm pp(1, {{10, 11, 12, nan, nan, nan, nan},
                      {},  // this rank
                      {nan, nan, nan, nan, nan, 15, 16}});
  CommPolicyCollectives c(nullptr, &pp, 7);
  std::vector<double> v = {nan, nan, nan, 13, 14, nan, nan};
  c.gather_layers(v, 3, 5);
  EXPECT_EQ(v, (std::vector<double>{10, 11, 12, 13, 14, 15, 16}));
  EXPECT_THROW(c.gather_layers(v, 0, 3), std::logic_error);  // not this stage's layers
  std::vector<double> short_list(6);
  EXPECT_THROW(c.gather_layers(short_list, 3, 5), std::invalid_argument);
}

TEST(CommPolicyCollectives, AloneNothingChanges) {
  CommPolicyCollectives c(nullptr, nullptr, 4);
  std::vector<double> v = {1, 2, 3, 4};
  c.tp_all_reduce(v, ReduceOp::sum);
  c.gather_layers(v, 0, 4);
  EXPECT_EQ(v, (std::vector<double>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace strata
