// The HTTP server on 127.0.0.1 with an ephemeral port, spoken to over real sockets by a small Beast client.
// Behind it: a scripted GenerationService that answers every request with a list of events from its own thread.
#include "routing/http_server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "leader/generation.h"
#include "model/byte_level.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "tests/routing/byte_tokenizer.h"

namespace strata {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;
using namespace std::chrono_literals;

using test::byte_tokenizer;

// Polls a condition for up to five seconds.
bool eventually(const std::function<bool()>& condition) {
  for (auto deadline = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < deadline;) {
    if (condition()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return condition();
}

class ScriptedService : public GenerationService {
 public:
  ~ScriptedService() override {
    release();
    for (std::thread& thread : threads_) thread.join();
  }

  // Every request gets these events, in order, from a thread of its own. With hold_after = k, the thread stops
  // after k events until release() or until the request is cancelled.
  std::vector<GenerationEvent> script;
  int hold_after = -1;
  std::function<void()> submit_hook;  // runs first in submit(); may throw like the engine does
  std::atomic<bool> is_healthy{true};
  std::string metrics = "strata_requests_running 0\n";

  void submit(GenerationRequest request) override {
    if (submit_hook) submit_hook();
    std::shared_ptr<GenerationSink> sink = request.sink;
    std::lock_guard lock(mutex_);  // the server's I/O threads submit concurrently
    request.sink.reset();
    requests_.push_back(std::move(request));
    sinks_.push_back(sink);
    threads_.emplace_back([this, sink, events = script, hold = hold_after] {
      for (size_t i = 0; i < events.size(); ++i) {
        if (int(i) == hold) {
          std::unique_lock lock(mutex_);
          released_cv_.wait(lock, [&] { return released_ || sink->cancelled(); });
          if (sink->cancelled()) return;
        }
        sink->on_event(events[i]);
      }
    });
  }
  std::string metrics_text() override {
    if (metrics.empty()) throw std::runtime_error("metrics unavailable");
    return metrics;
  }
  std::string kv_state_json() override { return R"({"layers": []})"; }
  bool healthy() const override { return is_healthy; }

  void release() {
    std::lock_guard lock(mutex_);
    released_ = true;
    released_cv_.notify_all();
  }
  // Wakes held threads so that they notice cancellations.
  void poke() { released_cv_.notify_all(); }

  std::vector<GenerationRequest> requests() {
    std::lock_guard lock(mutex_);
    return requests_;
  }
  std::shared_ptr<GenerationSink> sink(size_t i) {
    std::lock_guard lock(mutex_);
    return i < sinks_.size() ? sinks_[i] : nullptr;
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_cv_;
  bool released_ = false;
  std::vector<GenerationRequest> requests_;
  std::vector<std::shared_ptr<GenerationSink>> sinks_;
  std::vector<std::thread> threads_;
};

// A blocking HTTP/1.1 client on one connection; reads give up after ten seconds instead of hanging the test.
class Client {
 public:
  explicit Client(uint16_t port) : socket_(io_) {
    socket_.connect(tcp::endpoint(net::ip::address_v4::loopback(), port));
    timeval timeout{10, 0};
    setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  }

  http::response<http::string_body> send(http::verb method, const std::string& target, const std::string& body = "") {
    http::request<http::string_body> request{method, target, 11};
    request.set(http::field::host, "127.0.0.1");
    if (method == http::verb::post) request.set(http::field::content_type, "application/json");
    request.body() = body;
    request.prepare_payload();
    http::write(socket_, request);
    return read();
  }
  http::response<http::string_body> post(const std::string& target, const json& body) {
    return send(http::verb::post, target, body.dump());
  }
  http::response<http::string_body> get(const std::string& target) { return send(http::verb::get, target); }
  http::response<http::string_body> send_request(http::request<http::string_body> request) {
    request.prepare_payload();
    http::write(socket_, request);
    return read();
  }
  // A GET on a connection of its own (this one may be closed).
  static http::response<http::string_body> get_on_new_connection(uint16_t port, const std::string& target) {
    Client other(port);
    return other.get(target);
  }

  http::response<http::string_body> read() {
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    http::read(socket_, buffer_, parser);
    return parser.release();
  }
  void write_raw(const std::string& bytes) { net::write(socket_, net::buffer(bytes)); }
  // Raw bytes until `needle` shows up (or the connection ends); returns all read so far.
  std::string read_until(const std::string& needle) {
    std::string data;
    char chunk[4096];
    while (data.find(needle) == std::string::npos) {
      beast::error_code ec;
      size_t n = socket_.read_some(net::buffer(chunk), ec);
      if (ec) break;
      data.append(chunk, n);
    }
    return data;
  }
  // True when the server has closed the connection (a read ends without data).
  bool closed_by_server() {
    char byte;
    beast::error_code ec;
    socket_.read_some(net::buffer(&byte, 1), ec);
    return ec == net::error::eof || ec == net::error::connection_reset;
  }
  void close() { socket_.close(); }

 private:
  net::io_context io_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
};

class HttpServerTest : public ::testing::Test {
 protected:
  HttpServerTest() : tokenizer_(byte_tokenizer()), chat_template_(ChatTemplateKind::chatml) {
    options_.host = "127.0.0.1";
    options_.port = 0;
    options_.limits.model_name = "smol";
    options_.limits.max_context = 128;
    options_.max_body_bytes = 4096;
    options_.read_timeout = 5s;
    service_.script = {ChoiceDelta{0, "Hello", {'H'}, {}}, ChoiceDelta{0, " world", {' '}, {}},
                       ChoiceFinished{0, FinishReason::stop}, RequestFinished{Usage{2, 2}}};
  }
  ~HttpServerTest() override {
    if (server_) server_->stop();
  }

  void start() {
    server_ = std::make_unique<HttpServer>(options_, service_, tokenizer_, chat_template_);
    server_->start();
    ASSERT_NE(server_->port(), 0);
  }
  Client client() { return Client(server_->port()); }

  static void expect_error(const http::response<http::string_body>& response, int status, const std::string& type) {
    EXPECT_EQ(response.result_int(), status) << response.body();
    EXPECT_EQ(response[http::field::content_type], "application/json");
    json body = json::parse(response.body());
    EXPECT_EQ(body["error"]["type"], type) << response.body();
    EXPECT_TRUE(body["error"]["message"].is_string());
    EXPECT_TRUE(body["error"].contains("param"));
    EXPECT_TRUE(body["error"].contains("code"));
  }

  ServerOptions options_;
  ScriptedService service_;
  Tokenizer tokenizer_;
  ChatTemplate chat_template_;
  std::unique_ptr<HttpServer> server_;
};

json with_fields(json body, const json& extra) {
  body.update(extra);
  return body;
}

const json kCompletion = {{"model", "smol"}, {"prompt", "Hi"}, {"max_tokens", 5}};
const json kChat = {{"model", "smol"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};

std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    EXPECT_EQ(body.compare(pos, 6, "data: "), 0) << body.substr(pos);
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "unterminated event: " << body.substr(pos);
      break;
    }
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

TEST_F(HttpServerTest, HealthModelsMetricsKvState) {
  start();
  Client c = client();
  auto health = c.get("/health");
  EXPECT_EQ(health.result_int(), 200);
  EXPECT_EQ(json::parse(health.body()), json({{"status", "ok"}}));

  auto models = c.get("/v1/models");
  EXPECT_EQ(models.result_int(), 200);
  json list = json::parse(models.body());
  EXPECT_EQ(list["object"], "list");
  EXPECT_EQ(list["data"][0]["id"], "smol");
  EXPECT_EQ(list["data"][0]["object"], "model");
  EXPECT_EQ(list["data"][0]["max_model_len"], 128);
  auto one = c.get("/v1/models/smol");
  ASSERT_EQ(one.result_int(), 200) << one.body();
  EXPECT_EQ(json::parse(one.body()), list["data"][0]);
  EXPECT_EQ(c.get("/v1/models/sm%6Fl").result_int(), 200);  // percent-encoded as clients may send it
  auto other = c.get("/v1/models/gpt-4");
  expect_error(other, 404, "invalid_request_error");
  EXPECT_EQ(json::parse(other.body())["error"]["code"], "model_not_found");
  expect_error(c.get("/v1/models/sm%6"), 404, "invalid_request_error");  // "sm%6": not an escape, another name

  auto metrics = c.get("/metrics");
  EXPECT_EQ(metrics.result_int(), 200);
  EXPECT_EQ(metrics[http::field::content_type], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_TRUE(metrics.body().starts_with(service_.metrics)) << "the engine's exposition, then the front end's";

  auto tokens = c.post("/tokenize", {{"prompt", "Hi"}});
  ASSERT_EQ(tokens.result_int(), 200) << tokens.body();
  EXPECT_EQ(json::parse(tokens.body())["tokens"], json({'H', 'i'}));
  auto text = c.post("/detokenize", {{"tokens", {'H', 'i'}}});
  ASSERT_EQ(text.result_int(), 200) << text.body();
  EXPECT_EQ(json::parse(text.body())["prompt"], "Hi");
  expect_error(c.post("/tokenize", {{"prompt", "Hi"}, {"n", 2}}), 400, "invalid_request_error");

  auto kv = c.get("/v1/kv_state?verbose=1");  // the query string does not change the route
  EXPECT_EQ(kv.result_int(), 200);
  EXPECT_EQ(json::parse(kv.body()), json::parse(R"({"layers": []})"));

  service_.is_healthy = false;
  EXPECT_EQ(c.get("/health").result_int(), 503);
}

TEST_F(HttpServerTest, UnknownRouteAndWrongMethod) {
  start();
  Client c = client();
  auto missing = c.get("/v1/nothing");
  expect_error(missing, 404, "not_found_error");

  auto wrong = c.get("/v1/completions");
  expect_error(wrong, 405, "invalid_request_error");
  EXPECT_EQ(wrong[http::field::allow], "POST");
  auto wrong_get = c.post("/health", json::object());
  expect_error(wrong_get, 405, "invalid_request_error");
  EXPECT_EQ(wrong_get[http::field::allow], "GET");
  EXPECT_EQ(c.get("/health").result_int(), 200);  // the connection survived all of it
  // Each error is counted in /metrics, after the engine's exposition, by the status answered.
  const std::string text = c.get("/metrics").body();
  EXPECT_TRUE(text.starts_with(service_.metrics)) << text;
  EXPECT_NE(text.find("# TYPE strata_request_errors_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("strata_request_errors_total{status=\"404\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("strata_request_errors_total{status=\"405\"} 2\n"), std::string::npos) << text;
}

TEST_F(HttpServerTest, MalformedJsonAndValidationKeepTheConnection) {
  start();
  Client c = client();
  auto malformed = c.send(http::verb::post, "/v1/completions", "{\"prompt\": ");
  expect_error(malformed, 400, "invalid_request_error");
  EXPECT_TRUE(malformed.keep_alive());

  auto bad_field = c.post("/v1/chat/completions", {{"messages", json::array()}});
  expect_error(bad_field, 400, "invalid_request_error");
  EXPECT_EQ(json::parse(bad_field.body())["error"]["param"], "messages");

  auto other_model = c.post("/v1/completions", {{"model", "gpt-4"}, {"prompt", "x"}});
  expect_error(other_model, 404, "invalid_request_error");
  EXPECT_EQ(json::parse(other_model.body())["error"]["code"], "model_not_found");

  auto too_long = c.post("/v1/completions", {{"prompt", std::string(200, 'a')}});
  expect_error(too_long, 400, "invalid_request_error");

  EXPECT_EQ(c.get("/health").result_int(), 200);
  EXPECT_TRUE(service_.requests().empty());
}

TEST_F(HttpServerTest, BodyOverTheLimitIs413AndCloses) {
  options_.max_body_bytes = 1024;
  start();
  Client c = client();
  // The header announces the size, so the server answers before reading the body.
  c.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              "Content-Length: 5000\r\n\r\n" + std::string(512, ' '));
  auto response = c.read();
  expect_error(response, 413, "invalid_request_error");
  EXPECT_FALSE(response.keep_alive());
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(HttpServerTest, ExpectContinueIsAnswered) {
  start();
  Client c = client();
  std::string body = kCompletion.dump();
  c.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
              std::to_string(body.size()) + "\r\n\r\n");
  EXPECT_NE(c.read_until("\r\n\r\n").find("HTTP/1.1 100 Continue"), std::string::npos);
  c.write_raw(body);
  auto response = c.read();
  EXPECT_EQ(response.result_int(), 200) << response.body();
}

TEST_F(HttpServerTest, HeaderOverTheLimitIs431) {
  options_.max_header_bytes = 1024;
  start();
  Client c = client();
  c.write_raw("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n");
  auto response = c.read();
  expect_error(response, 431, "invalid_request_error");
}

TEST_F(HttpServerTest, GarbageIs400AndCloses) {
  start();
  Client c = client();
  c.write_raw("NOT HTTP AT ALL\r\n\r\n");
  auto response = c.read();
  expect_error(response, 400, "invalid_request_error");
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(HttpServerTest, IdleConnectionTimesOut) {
  options_.idle_timeout = 1s;
  options_.read_timeout = 30s;
  start();
  Client c = client();
  auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(c.closed_by_server());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  Client kept_alive = client();
  EXPECT_EQ(kept_alive.get("/health").result_int(), 200);
  started = std::chrono::steady_clock::now();
  EXPECT_TRUE(kept_alive.closed_by_server()) << "idle after a request too";
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
}

TEST_F(HttpServerTest, IdleTimeoutDoesNotCutARequestBeingRead) {
  options_.idle_timeout = 1s;
  options_.read_timeout = 10s;
  start();
  Client c = client();
  c.write_raw("GET /health HTTP/1.1\r\n");
  std::this_thread::sleep_for(1500ms);  // longer than the idle timeout, within the read timeout
  c.write_raw("Host: x\r\n\r\n");
  EXPECT_EQ(c.read().result_int(), 200);
}

TEST_F(HttpServerTest, ApiKeysGuardV1ButNotHealth) {
  options_.api_keys = {"sk-one", "sk-two"};
  start();
  Client c = client();
  auto missing = c.get("/v1/models");
  expect_error(missing, 401, "invalid_request_error");
  EXPECT_EQ(json::parse(missing.body())["error"]["code"], "invalid_api_key");
  EXPECT_EQ(missing[http::field::www_authenticate], "Bearer");
  EXPECT_TRUE(missing.keep_alive());
  auto send = [&](const std::string& target, const std::string& authorization) {
    http::request<http::string_body> request{http::verb::get, target, 11};
    request.set(http::field::host, "x");
    request.set(http::field::authorization, authorization);
    return c.send_request(request);
  };
  auto wrong = send("/v1/models", "Bearer sk-three");
  expect_error(wrong, 401, "invalid_request_error");
  EXPECT_EQ(wrong.body().find("sk-three"), std::string::npos) << "the key is not echoed";
  EXPECT_EQ(send("/v1/models", "Bearer sk-two").result_int(), 200);
  EXPECT_EQ(send("/v1/kv_state", "Bearer sk-one").result_int(), 200);
  expect_error(c.get("/v1/no_such_route"), 401, "invalid_request_error");  // routes are not revealed without a key
  EXPECT_EQ(c.get("/health").result_int(), 200);
  EXPECT_EQ(c.get("/metrics").result_int(), 200) << "open unless metrics_require_key";
  auto completion = c.post("/v1/completions", kCompletion);
  expect_error(completion, 401, "invalid_request_error");
  EXPECT_TRUE(service_.requests().empty()) << "nothing reached the engine";
  expect_error(c.post("/tokenize", {{"prompt", "Hi"}}), 401, "invalid_request_error");  // the tokenizer's too
  expect_error(c.post("/detokenize", {{"tokens", {72}}}), 401, "invalid_request_error");
}

TEST_F(HttpServerTest, MetricsMayRequireAKey) {
  options_.api_keys = {"sk-one"};
  options_.metrics_require_key = true;
  start();
  Client c = client();
  expect_error(c.get("/metrics"), 401, "invalid_request_error");
  http::request<http::string_body> request{http::verb::get, "/metrics", 11};
  request.set(http::field::authorization, "Bearer sk-one");
  EXPECT_EQ(c.send_request(request).result_int(), 200);
  EXPECT_EQ(c.get("/health").result_int(), 200);
}

TEST_F(HttpServerTest, DrainRefusesNewRequestsAndLetsThoseInFlightFinish) {
  service_.hold_after = 1;
  start();
  Client streaming = client();
  Client idle = client();
  EXPECT_EQ(idle.get("/health").result_int(), 200);
  std::string body = with_fields(kCompletion, {{"stream", true}}).dump();
  streaming.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                      "\r\n\r\n" + body);
  streaming.read_until("Hello");
  EXPECT_EQ(server_->n_in_flight(), 1);
  server_->start_draining();

  auto health = idle.get("/health");
  EXPECT_EQ(health.result_int(), 503);
  EXPECT_EQ(json::parse(health.body()), json({{"status", "draining"}}));
  EXPECT_FALSE(health.keep_alive()) << "a draining server closes connections after their response";
  Client late = client();
  auto refused = late.post("/v1/completions", kCompletion);
  expect_error(refused, 503, "server_error");
  EXPECT_EQ(refused[http::field::retry_after], "5");
  EXPECT_EQ(json::parse(refused.body())["error"]["code"], "draining");
  EXPECT_EQ(service_.requests().size(), 1u) << "the refused request never reached the engine";
  EXPECT_EQ(late.get_on_new_connection(server_->port(), "/metrics").result_int(), 200) << "metrics stay readable";

  service_.release();
  std::string rest = streaming.read_until("[DONE]");
  EXPECT_NE(rest.find("world"), std::string::npos) << rest;
  EXPECT_TRUE(eventually([&] { return server_->n_in_flight() == 0; }));
}

TEST_F(HttpServerTest, ConnectionsBeyondTheLimitGet503AndClose) {
  options_.max_connections = 2;
  start();
  Client first = client();
  Client second = client();
  EXPECT_EQ(first.get("/health").result_int(), 200);
  EXPECT_EQ(second.get("/health").result_int(), 200);
  Client third = client();
  auto refused = third.get("/v1/models");
  expect_error(refused, 503, "server_error");
  EXPECT_EQ(json::parse(refused.body())["error"]["code"], "too_many_connections");
  EXPECT_EQ(refused[http::field::retry_after], "1");
  EXPECT_FALSE(refused.keep_alive());
  EXPECT_TRUE(third.closed_by_server());
  EXPECT_EQ(first.get("/health").result_int(), 200) << "the connections held are served on";
  first.close();
  EXPECT_TRUE(eventually([&] {  // its slot comes back once the server has seen the close
    Client fourth = client();
    return fourth.get("/health").result_int() == 200;
  }));
}

// Out of descriptors, accept() fails at once every time it is retried: the listener must pause between tries and
// say so once, then serve the connection that waited when a descriptor is free again.
TEST_F(HttpServerTest, AcceptFailuresBackOffAndAreLoggedOnce) {
  start();
  testing::internal::CaptureStderr();
  rlimit original{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &original), 0);
  const int lowest_free = ::dup(0);
  ::close(lowest_free);
  rlimit tight = original;
  tight.rlim_cur = rlim_t(lowest_free + 1);  // room for the client's socket, none for the server's side
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(server_->port());
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int connected = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  std::this_thread::sleep_for(1500ms);
  setrlimit(RLIMIT_NOFILE, &original);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(connected, 0);

  const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), ssize_t(request.size()));
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string response;
  char chunk[1024];
  for (ssize_t n; (n = ::recv(fd, chunk, sizeof chunk, 0)) > 0;) response.append(chunk, size_t(n));
  ::close(fd);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  size_t n_failure_lines = 0;
  for (size_t at = log.find("accept failed"); at != std::string::npos; at = log.find("accept failed", at + 1)) {
    ++n_failure_lines;
  }
  EXPECT_EQ(n_failure_lines, 1u) << log;
  EXPECT_NE(log.find("Too many open files"), std::string::npos) << log;
  EXPECT_NE(log.find("accepting connections again after"), std::string::npos) << log;
}

TEST_F(HttpServerTest, NonStreamingCompletion) {
  start();
  Client c = client();
  auto response = c.post("/v1/completions", with_fields(kCompletion, {{"temperature", 0.5}, {"seed", 7}}));
  ASSERT_EQ(response.result_int(), 200) << response.body();
  EXPECT_EQ(response[http::field::content_type], "application/json");
  json body = json::parse(response.body());
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "smol");
  EXPECT_EQ(body["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(body["choices"][0]["text"], "Hello world");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"], json({{"prompt_tokens", 2},
                                 {"completion_tokens", 2},
                                 {"total_tokens", 4},
                                 {"prompt_tokens_details", {{"cached_tokens", 0}}}}));

  auto requests = service_.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].prompt_ids, (std::vector<int32_t>{'H', 'i'}));
  EXPECT_EQ(requests[0].sampling.max_tokens, 5);
  EXPECT_FLOAT_EQ(requests[0].sampling.temperature, 0.5f);
  EXPECT_EQ(requests[0].sampling.seed, 7u);
  EXPECT_EQ(requests[0].id, body["id"]);

  // Keep-alive: the same connection serves the next request.
  auto again = c.post("/v1/chat/completions", kChat);
  ASSERT_EQ(again.result_int(), 200) << again.body();
  json chat = json::parse(again.body());
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"], json({{"role", "assistant"}, {"content", "Hello world"}}));
}

TEST_F(HttpServerTest, StreamingCompletionIsServerSentEvents) {
  start();
  Client c = client();
  auto response = c.post("/v1/completions", with_fields(kCompletion, {{"stream", true}}));
  ASSERT_EQ(response.result_int(), 200);
  EXPECT_EQ(response[http::field::content_type], "text/event-stream");
  EXPECT_EQ(response[http::field::cache_control], "no-cache");
  EXPECT_TRUE(response.chunked());
  std::vector<std::string> events = sse_data(response.body());
  ASSERT_EQ(events.size(), 4u) << response.body();
  EXPECT_EQ(json::parse(events[0])["choices"][0]["text"], "Hello");
  EXPECT_EQ(json::parse(events[1])["choices"][0]["text"], " world");
  EXPECT_EQ(json::parse(events[2])["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(events[3], "[DONE]");
  EXPECT_EQ(c.get("/health").result_int(), 200);  // keep-alive after a stream
}

TEST_F(HttpServerTest, StreamingChatStartsWithTheRoleAndCanReportUsage) {
  start();
  Client c = client();
  auto response = c.post("/v1/chat/completions",
                         with_fields(kChat, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(response.result_int(), 200);
  std::vector<std::string> events = sse_data(response.body());
  ASSERT_EQ(events.size(), 6u) << response.body();
  EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(json::parse(events[1])["object"], "chat.completion.chunk");
  EXPECT_EQ(json::parse(events[1])["choices"][0]["delta"], json({{"content", "Hello"}}));
  EXPECT_EQ(json::parse(events[3])["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(json::parse(events[4])["usage"]["total_tokens"], 4);
  EXPECT_EQ(events[5], "[DONE]");
}

TEST_F(HttpServerTest, StreamWritesEachEventAsItComes) {
  service_.hold_after = 1;  // "Hello", then nothing until the test has seen it
  start();
  Client c = client();
  c.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
              std::to_string(with_fields(kCompletion, {{"stream", true}}).dump().size()) + "\r\n\r\n" +
              with_fields(kCompletion, {{"stream", true}}).dump());
  std::string first = c.read_until("Hello");
  EXPECT_NE(first.find("text/event-stream"), std::string::npos);
  EXPECT_NE(first.find("\"Hello\""), std::string::npos);
  EXPECT_EQ(first.find("world"), std::string::npos);
  service_.release();
  std::string rest = c.read_until("[DONE]");
  EXPECT_NE(rest.find("world"), std::string::npos);
}

TEST_F(HttpServerTest, EngineFailureBeforeTheFirstTokenGetsItsStatus) {
  service_.script = {RequestFailed{Failure::shutting_down, "the server is shutting down"}};
  start();
  Client c = client();
  auto streamed = c.post("/v1/completions", with_fields(kCompletion, {{"stream", true}}));
  expect_error(streamed, 503, "server_error");
  auto whole = c.post("/v1/completions", kCompletion);
  expect_error(whole, 503, "server_error");
  EXPECT_EQ(json::parse(whole.body())["error"]["message"], "the server is shutting down");
  EXPECT_EQ(json::parse(whole.body())["error"]["code"], "shutting_down");
  service_.script = {RequestFailed{Failure::step_failed, "engine step failed: out of memory"}};
  expect_error(c.post("/v1/completions", kCompletion), 500, "server_error");
}

TEST_F(HttpServerTest, EngineFailureMidStreamIsAnErrorEvent) {
  service_.script = {ChoiceDelta{0, "Hel", {}, {}}, RequestFailed{Failure::step_failed, "device lost"}};
  start();
  Client c = client();
  auto response = c.post("/v1/completions", with_fields(kCompletion, {{"stream", true}}));
  ASSERT_EQ(response.result_int(), 200);
  std::vector<std::string> events = sse_data(response.body());
  ASSERT_EQ(events.size(), 3u) << response.body();
  EXPECT_EQ(json::parse(events[1])["error"]["message"], "device lost");
  EXPECT_EQ(events[2], "[DONE]");
}

TEST_F(HttpServerTest, SubmitErrorsMapTo400And503) {
  service_.submit_hook = [] { throw std::invalid_argument("too long for the engine"); };
  start();
  Client c = client();
  auto rejected = c.post("/v1/completions", kCompletion);
  expect_error(rejected, 400, "invalid_request_error");
  EXPECT_EQ(json::parse(rejected.body())["error"]["message"], "too long for the engine");

  // The engine's typed refusals: 503, each with the code a client acts on.
  const std::pair<Refusal, const char*> refusals[] = {{Refusal::queue_full, "overloaded"},
                                                      {Refusal::draining, "draining"},
                                                      {Refusal::shutting_down, "shutting_down"},
                                                      {Refusal::rank_lost, "rank_lost"}};
  for (const auto& [why, code] : refusals) {
    service_.submit_hook = [why = why] { throw SubmitRefused(why, "not now"); };
    auto busy = c.post("/v1/completions", with_fields(kCompletion, {{"stream", true}}));
    expect_error(busy, 503, "server_error");
    EXPECT_EQ(json::parse(busy.body())["error"]["code"], code);
  }
  // Anything else is a bug: a 500, not a client's retry.
  service_.submit_hook = [] { throw std::runtime_error("unexpected"); };
  expect_error(c.post("/v1/completions", kCompletion), 500, "server_error");
}

TEST_F(HttpServerTest, ABatchOfPromptsIsOneResponse) {
  start();
  Client c = client();
  auto response = c.post("/v1/completions", with_fields(kCompletion, {{"prompt", {"Hi", "Yo!"}}, {"echo", true}}));
  ASSERT_EQ(response.result_int(), 200) << response.body();
  json body = json::parse(response.body());
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["text"], "HiHello world");
  EXPECT_EQ(body["choices"][1]["text"], "Yo!Hello world");
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);  // each scripted request reports 2
  auto requests = service_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1].prompt_ids, (std::vector<int32_t>{'Y', 'o', '!'}));
  EXPECT_EQ(requests[0].id, requests[1].id);
  EXPECT_EQ(requests[0].id, body["id"]);
}

TEST_F(HttpServerTest, ABatchPromptTheServiceRefusesCancelsThoseSubmittedBeforeIt) {
  service_.hold_after = 0;
  int submits = 0;
  service_.submit_hook = [&submits] {
    if (++submits == 2) throw std::invalid_argument("the prompt needs 9 KV blocks");
  };
  start();
  Client c = client();
  auto refused = c.post("/v1/completions", with_fields(kCompletion, {{"prompt", {"Hi", "Yo"}}}));
  expect_error(refused, 400, "invalid_request_error");
  EXPECT_EQ(json::parse(refused.body())["error"]["param"], "prompt[1]");
  ASSERT_EQ(service_.requests().size(), 1u);
  EXPECT_TRUE(eventually([&] { return service_.sink(0)->cancelled(); }));
}

TEST_F(HttpServerTest, HandlerExceptionIs500AndTheServerLivesOn) {
  service_.metrics.clear();  // metrics_text() throws
  start();
  Client c = client();
  expect_error(c.get("/metrics"), 500, "server_error");
  EXPECT_EQ(c.get("/health").result_int(), 200);
}

TEST_F(HttpServerTest, ClientGoneMidStreamCancelsTheRequest) {
  service_.hold_after = 1;
  start();
  {
    Client c = client();
    std::string body = with_fields(kCompletion, {{"stream", true}}).dump();
    c.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                "\r\n\r\n" + body);
    c.read_until("Hello");
    c.close();
  }
  ASSERT_TRUE(eventually([&] { return service_.sink(0) != nullptr; }));
  EXPECT_TRUE(eventually([&] { return service_.sink(0)->cancelled(); }));
  service_.poke();
}

TEST_F(HttpServerTest, ClientGoneWhileWaitingCancelsTheRequest) {
  service_.hold_after = 0;  // nothing at all until released
  start();
  {
    Client c = client();
    std::string body = kChat.dump();
    c.write_raw("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                "\r\n\r\n" + body);
    ASSERT_TRUE(eventually([&] { return service_.sink(0) != nullptr; }));
    c.close();
  }
  EXPECT_TRUE(eventually([&] { return service_.sink(0)->cancelled(); }));
  service_.poke();
}

TEST_F(HttpServerTest, StopCancelsRequestsInFlight) {
  service_.hold_after = 1;
  start();
  Client c = client();
  std::string body = with_fields(kCompletion, {{"stream", true}}).dump();
  c.write_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
              "\r\n\r\n" + body);
  c.read_until("Hello");
  server_->stop();
  EXPECT_TRUE(service_.sink(0)->cancelled());
  service_.release();  // the engine may still send events after the server is gone
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(HttpServerTest, ManyConcurrentClients) {
  options_.threads = 2;
  start();
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      Client c = client();
      for (int j = 0; j < 5; ++j) {
        bool stream = (i + j) % 2 == 0;
        auto response = c.post("/v1/completions", with_fields(kCompletion, {{"stream", stream}}));
        if (response.result_int() == 200 && response.body().find("world") != std::string::npos) ++ok;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(ok, 40);
}

TEST(HttpServer, BindFailureNamesTheAddress) {
  ScriptedService service;
  Tokenizer tokenizer = byte_tokenizer();
  ChatTemplate chat_template(ChatTemplateKind::chatml);
  ServerOptions options;
  options.port = 0;
  HttpServer first(options, service, tokenizer, chat_template);
  first.start();
  options.port = first.port();
  HttpServer second(options, service, tokenizer, chat_template);
  try {
    second.start();
    FAIL() << "bound a port already in use";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
