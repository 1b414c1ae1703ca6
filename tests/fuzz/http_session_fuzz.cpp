// libFuzzer harness: the HTTP server (routing/http_server.h) reading arbitrary bytes from a client: Beast's request
// parser with the server's limits, the routes, the OpenAI requests with SmolLM2's tokenizer and template, and the
// answers, whole or streamed, from a service that answers every request at once. The bytes go through a loopback
// connection to a server started once (its sessions are private to http_session.cpp), each from another loopback
// source address; the client then closes its sending side and reads every answer until the server closes.
// Bugs: a crash, a sanitizer report, an answer that is not HTTP, a 5xx answer to a client's bytes, a connection
// the server does not close within 5 s of the client's end of input.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "leader/generation.h"
#include "routing/http_server.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/generation_events.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using strata::fuzz::fail;

// Answers every request at once with the events an engine would send.
class AnsweringService final : public strata::GenerationService {
 public:
  void submit(strata::GenerationRequest request) override {
    for (strata::GenerationEvent& event : strata::fuzz::generation_events(request)) request.sink->on_event(event);
  }
  std::string metrics_text() override { return "strata_requests_total 0\n"; }
  std::string kv_state_json() override { return "{}"; }
  bool healthy() const override { return true; }
};

strata::HttpServer& server() {
  static AnsweringService service;
  static std::unique_ptr<strata::HttpServer> server = [] {
    strata::ServerOptions options;
    options.port = 0;
    options.threads = 1;
    options.limits.model_name = "SmolLM2-135M-Instruct";
    options.max_body_bytes = 64 << 10;  // small limits, so that short inputs reach them
    options.max_header_bytes = 2 << 10;
    auto started = std::make_unique<strata::HttpServer>(options, service, strata::fuzz::smollm2_tokenizer(),
                                                        strata::fuzz::smollm2_chat_template());
    started->start();
    return started;
  }();
  return *server;
}

// Binds the client socket to the next of 62,500 loopback addresses (127.1.x.y). The client ends its input first,
// so each connection leaves a TIME_WAIT for a minute, and one source address has only ~28,000 ephemeral ports.
void bind_next_source_address(int fd) {
  static uint32_t n_connections = 0;
  const uint32_t k = n_connections++ % (250 * 250);
  sockaddr_in source{};
  source.sin_family = AF_INET;
  source.sin_addr.s_addr = htonl((127u << 24) | (1u << 16) | ((k / 250 + 1) << 8) | (k % 250 + 1));
  const int on = 1;  // the port is chosen at connect(), for the whole address pair
  ::setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &on, sizeof on);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&source), sizeof source) != 0) {
    fail(std::string("bind: ") + std::strerror(errno));
  }
}

// libFuzzer's timer (SIGALRM, for -timeout) interrupts blocking calls: a connect it interrupts goes on, and is
// waited for.
void connect_through_signals(int fd, const sockaddr_in& address) {
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) return;
  if (errno != EINTR) fail(std::string("connect: ") + std::strerror(errno));
  pollfd writable{fd, POLLOUT, 0};
  while (::poll(&writable, 1, -1) < 0) {
    if (errno != EINTR) fail(std::string("poll: ") + std::strerror(errno));
  }
  int error = 0;
  socklen_t length = sizeof error;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
  if (error != 0) fail(std::string("connect: ") + std::strerror(error));
}

// Sends the bytes, ends the input, and returns everything the server writes until it closes.
std::string exchange(const uint8_t* data, size_t size) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(std::string("socket: ") + std::strerror(errno));
  bind_next_source_address(fd);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(server().port());
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connect_through_signals(fd, address);
  const timeval answer_timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &answer_timeout, sizeof answer_timeout);
  for (size_t sent = 0; sent < size;) {  // the server may close early, after an error: stop sending then
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    sent += size_t(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string answer;
  char chunk[16 << 10];
  for (;;) {
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) fail("the server kept the connection open for 5 s");
    if (n <= 0) break;  // closed, or reset after unread input
    answer.append(chunk, size_t(n));
  }
  ::close(fd);
  return answer;
}

// Reads a fixed string as a socket would: Beast's parser then reads the answers as a client does.
class StringStream {
 public:
  explicit StringStream(std::string_view bytes) : rest_(bytes) {}
  template <typename Buffers>
  size_t read_some(const Buffers& buffers, beast::error_code& ec) {
    ec = {};
    if (rest_.empty()) ec = http::error::end_of_stream;
    const size_t n = boost::asio::buffer_copy(buffers, boost::asio::buffer(rest_.data(), rest_.size()));
    rest_.remove_prefix(n);
    return n;
  }
  template <typename Buffers>
  size_t read_some(const Buffers& buffers) {
    beast::error_code ec;
    const size_t n = read_some(buffers, ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }

 private:
  std::string_view rest_;
};

void check_answers(std::string_view answer) {
  StringStream stream(answer);
  beast::flat_buffer buffer;
  for (;;) {
    http::response_parser<http::string_body> parser;
    parser.body_limit(boost::none);
    beast::error_code ec;
    http::read(stream, buffer, parser, ec);
    if (ec == http::error::end_of_stream) return;
    if (ec) fail("an answer that is not HTTP (" + ec.message() + "): " + std::string(answer.substr(0, 200)));
    if (parser.get().result_int() >= 500) fail("a " + std::to_string(parser.get().result_int()) + " answer");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  server();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check_answers(exchange(data, size));
  return 0;
}
