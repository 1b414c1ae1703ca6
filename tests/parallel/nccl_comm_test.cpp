// NcclComm in a world of one rank on a GPU (the multi-rank paths run in a CUDA world, docs/distributed.md): the
// all-reduce and all-gather of one rank, and sends to itself, on device buffers queued on a stream. Skipped, with
// the reason, in a build without NCCL or on a machine without a GPU.
#ifdef STRATA_HAVE_NCCL
#include "parallel/nccl_comm.h"
#endif

#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

#ifdef STRATA_HAVE_NCCL

// The bootstrap group of a world of one: nobody to broadcast to.
class SoloComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(std::span<float>) override {}
  void all_gather_bytes(std::span<const uint8_t> mine, std::span<uint8_t> all) override {
    std::copy(mine.begin(), mine.end(), all.begin());
  }
  void broadcast(std::vector<uint8_t>&, int) override {}
  std::vector<std::vector<uint8_t>> gather(std::vector<uint8_t>, int) override { return {{}}; }
  void send(std::span<const float>, int) override { throw std::logic_error("not in a world of one"); }
  void send_async(std::span<const float>, int) override { throw std::logic_error("not in a world of one"); }
  void wait_sends() override {}
  void recv(std::span<float>, int) override { throw std::logic_error("not in a world of one"); }
  void send_bytes(std::span<const uint8_t>, int) override { throw std::logic_error("not in a world of one"); }
  std::vector<uint8_t> recv_bytes(int) override { throw std::logic_error("not in a world of one"); }
};

// A device buffer of n floats, filled from / read back to the host through the stream.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t n, cudaStream_t stream) : n_(n), stream_(stream) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(float)), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  std::span<float> span() { return {data_, n_}; }
  void set(const std::vector<float>& v) {
    ASSERT_EQ(cudaMemcpyAsync(data_, v.data(), n_ * sizeof(float), cudaMemcpyHostToDevice, stream_), cudaSuccess);
  }
  std::vector<float> get() {
    std::vector<float> v(n_);
    EXPECT_EQ(cudaMemcpyAsync(v.data(), data_, n_ * sizeof(float), cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return v;
  }

 private:
  size_t n_;
  cudaStream_t stream_;
  float* data_ = nullptr;
};

class NcclCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no CUDA device (" << (e == cudaSuccess ? "none present" : cudaGetErrorString(e))
                   << "): NcclComm needs a GPU";
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    auto deadline = std::make_shared<CommDeadline>();
    deadline->timeout = std::chrono::seconds(20);
    comm_ = std::make_unique<NcclComm>(solo_, std::vector<std::string>{"rank 0 (pp_stage 0, tp_rank 0)"},
                                       "a world of one", deadline, stream_);
  }
  void TearDown() override {
    comm_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }

  SoloComm solo_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<NcclComm> comm_;
};

TEST_F(NcclCommTest, AllReduceOfOneRankKeepsItsValues) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  const std::vector<float> v = {1.5f, -2.25f, 3.0e-8f, 1.0e8f, 0.0f};
  DeviceBuffer buf(v.size(), stream_);
  buf.set(v);
  comm_->all_reduce_sum(buf.span());
  EXPECT_EQ(buf.get(), v);
}

TEST_F(NcclCommTest, AllGatherOfOneRankIsItsSlice) {
  const std::vector<float> v = {4.0f, 5.0f, 6.0f};
  DeviceBuffer mine(v.size(), stream_), all(v.size(), stream_);
  mine.set(v);
  all.set({0.0f, 0.0f, 0.0f});
  comm_->all_gather(mine.span(), all.span());
  EXPECT_EQ(all.get(), v);
  DeviceBuffer too_small(2, stream_);
  EXPECT_THROW(comm_->all_gather(mine.span(), too_small.span()), std::invalid_argument);
}

TEST_F(NcclCommTest, SendsToSelfArriveInOrderAndTakeTheDataWhenQueued) {
  DeviceBuffer a(4, stream_), got(4, stream_);
  a.set({1, 2, 3, 4});
  comm_->send_async(a.span(), 0);
  a.set({5, 6, 7, 8});  // queued after the send: the send keeps the values it was given
  comm_->send_async(a.span(), 0);
  a.set({0, 0, 0, 0});
  comm_->recv(got.span(), 0);
  EXPECT_EQ(got.get(), (std::vector<float>{1, 2, 3, 4}));
  comm_->recv(got.span(), 0);
  EXPECT_EQ(got.get(), (std::vector<float>{5, 6, 7, 8}));
  comm_->wait_sends();
  EXPECT_THROW(comm_->recv(got.span(), 0), std::logic_error);  // nothing left to receive
}

#else

TEST(NcclComm, NeedsTheCudaBuild) {
  GTEST_SKIP() << "built without NCCL (STRATA_CUDA off): parallel/nccl_comm.cpp is not compiled";
}

#endif

}  // namespace
}  // namespace strata
