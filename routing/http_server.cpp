#include "routing/http_server.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_set>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "leader/generation.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "routing/accept_backoff.h"
#include "routing/api_error.h"
#include "routing/api_keys.h"
#include "routing/connection_limit.h"
#include "routing/openai_protocol.h"
#include "routing/prompt_batch.h"
#include "routing/tokenizer_endpoints.h"

namespace strata {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using namespace net::experimental::awaitable_operators;

constexpr auto use_nothrow = net::as_tuple(net::use_awaitable);
constexpr std::string_view kServerName = "strata";
constexpr std::chrono::seconds kLingerTime{2};  // how long a connection closed after an error still drains input
// Retry-After of the 503s a draining server answers: time for a load balancer's health check to take it out.
constexpr std::string_view kDrainRetryAfterS = "5";
// Retry-After of the 503 a connection over the limit gets.
constexpr std::string_view kBusyRetryAfterS = "1";
// How long a refused connection may stay for its answer to be read: short, since refusals in flight are bounded
// and the connections behind them wait in the backlog.
constexpr std::chrono::milliseconds kRefusalLinger{250};
// How often a listener with every connection and refusal slot taken looks again.
constexpr std::chrono::milliseconds kFullPoll{10};

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------------------------------------------
// The bridge from the engine thread to a session: a locked queue plus a wake-up posted to the session's strand.
// Queue depth is bounded by the request itself: at most n * max_tokens deltas plus n + 1 closing events.

class EventQueueSink final : public GenerationSink, public std::enable_shared_from_this<EventQueueSink> {
 public:
  // Engine thread: never blocks beyond the short lock.
  void on_event(GenerationEvent event) override {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
    if (waker_ && !wake_posted_) {
      wake_posted_ = true;
      net::post(waker_->get_executor(), [self = shared_from_this()] { self->wake(); });
    }
  }
  bool cancelled() const override { return cancelled_.load(std::memory_order_relaxed); }

  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }

  // Session strand: the timer to cancel when events arrive; nullptr stops the wake-ups (the timer is going away).
  void set_waker(net::steady_timer* timer) {
    std::lock_guard lock(mutex_);
    waker_ = timer;
  }
  bool has_events() const {
    std::lock_guard lock(mutex_);
    return !events_.empty();
  }
  std::deque<GenerationEvent> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(events_, {});
  }

 private:
  // Runs on the session's strand, where the timer lives; the timer is still there while waker_ is set.
  void wake() {
    std::lock_guard lock(mutex_);
    wake_posted_ = false;
    if (waker_) waker_->cancel();
  }

  mutable std::mutex mutex_;
  std::deque<GenerationEvent> events_;
  net::steady_timer* waker_ = nullptr;
  bool wake_posted_ = false;
  std::atomic<bool> cancelled_{false};
};

// The sinks of requests in flight, so that stop() can silence them before the io_context goes away.
class SinkRegistry {
 public:
  void add(EventQueueSink* sink) {
    std::lock_guard lock(mutex_);
    sinks_.insert(sink);
  }
  void remove(EventQueueSink* sink) {
    std::lock_guard lock(mutex_);
    sinks_.erase(sink);
  }
  void cancel_all() {
    std::lock_guard lock(mutex_);
    for (EventQueueSink* sink : sinks_) {
      sink->cancel();
      sink->set_waker(nullptr);
    }
  }
  int size() const {
    std::lock_guard lock(mutex_);
    return int(sinks_.size());
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_set<EventQueueSink*> sinks_;
};

// A session's hold on a request's sink: registered and woken through the timer while it lives; the request is
// cancelled on the way out unless it finished.
class SinkLease {
 public:
  SinkLease(SinkRegistry& registry, std::shared_ptr<EventQueueSink> sink, net::steady_timer& timer)
      : registry_(registry), sink_(std::move(sink)) {
    registry_.add(sink_.get());
    sink_->set_waker(&timer);
  }
  ~SinkLease() {
    if (!finished_) sink_->cancel();
    sink_->set_waker(nullptr);
    registry_.remove(sink_.get());
  }
  SinkLease(const SinkLease&) = delete;
  SinkLease& operator=(const SinkLease&) = delete;

  void finish() { finished_ = true; }

 private:
  SinkRegistry& registry_;
  std::shared_ptr<EventQueueSink> sink_;
  bool finished_ = false;
};

// ---------------------------------------------------------------------------------------------------------------
// Routes

enum class Route { completions, chat_completions, models, model, tokenize, detokenize, health, metrics, kv_state };

struct RouteEntry {
  std::string_view path;
  http::verb method;
  Route route;
  bool prefix = false;  // the path continues with an argument (/v1/models/{model})
};

constexpr RouteEntry kRoutes[] = {
    {"/v1/completions", http::verb::post, Route::completions},
    {"/v1/chat/completions", http::verb::post, Route::chat_completions},
    {"/v1/models", http::verb::get, Route::models},
    {"/v1/models/", http::verb::get, Route::model, true},
    {"/tokenize", http::verb::post, Route::tokenize},
    {"/detokenize", http::verb::post, Route::detokenize},
    {"/health", http::verb::get, Route::health},
    {"/metrics", http::verb::get, Route::metrics},
    {"/v1/kv_state", http::verb::get, Route::kv_state},
};

bool matches(const RouteEntry& route, std::string_view path) {
  if (!route.prefix) return path == route.path;
  return path.size() > route.path.size() && path.starts_with(route.path);
}

// A path segment with its %XX escapes decoded (a model id may hold '/', which clients send as is or as %2F); an
// escape that is not two hex digits stays as it is.
std::string percent_decoded(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out += char(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

Response make_response(unsigned version, bool keep_alive, http::status status, std::string body,
                       std::string_view content_type) {
  Response response{status, version};
  response.set(http::field::server, kServerName);
  response.set(http::field::content_type, content_type);
  response.keep_alive(keep_alive);
  response.body() = std::move(body);
  response.prepare_payload();
  return response;
}

Response error_response(unsigned version, bool keep_alive, const ApiError& error) {
  return make_response(version, keep_alive, http::status(error.http_status()), error.body(), "application/json");
}

std::string http_error_status_text(const ApiError& error) {
  return std::to_string(error.http_status()) + " " + error.type() + ": " + error.what();
}

// What every session shares: the options, the engine and tokenizer, the keys, the sinks in flight, the bounds on
// connections and whether the server drains.
struct ServerContext {
  ServerContext(ServerOptions options_in, GenerationService& service_in, const Tokenizer& tokenizer_in,
                const ChatTemplate& chat_template_in)
      : options(std::move(options_in)),
        service(service_in),
        tokenizer(tokenizer_in),
        chat_template(chat_template_in),
        keys(options.api_keys),
        connections(options.max_connections) {
    options.limits.vocab_size = tokenizer.vocab_size();
  }

  ServerOptions options;
  GenerationService& service;
  const Tokenizer& tokenizer;
  const ChatTemplate& chat_template;
  int64_t started_at = unix_now();
  SinkRegistry sinks;
  ApiKeys keys;
  ConnectionLimit connections;
  ConnectionLimit refusals{kMaxRefusalsInFlight};
  std::atomic<bool> draining{false};
};

// The served model as /v1/models lists it.
nlohmann::json model_object(const ServerContext& server) {
  return {{"id", server.options.limits.model_name},
          {"object", "model"},
          {"created", server.started_at},
          {"owned_by", kServerName},
          {"max_model_len", server.options.limits.max_context}};
}

// The answer of a route other than generation.
struct PlainAnswer {
  http::status status = http::status::ok;
  std::string body;
  std::string_view content_type = "application/json";
};

PlainAnswer plain_answer(ServerContext& server, const RouteEntry& route, std::string_view path,
                         std::string_view body) {
  switch (route.route) {
    case Route::models:
      return {.body = nlohmann::json({{"object", "list"}, {"data", nlohmann::json::array({model_object(server)})}})
                          .dump()};
    case Route::model:
      check_model_name(percent_decoded(path.substr(route.path.size())), server.options.limits);
      return {.body = model_object(server).dump()};
    case Route::tokenize:
      return {.body = tokenize_response(body, server.tokenizer, server.chat_template, server.options.limits)};
    case Route::detokenize:
      return {.body = detokenize_response(body, server.tokenizer, server.options.limits)};
    case Route::health: {
      const bool healthy = server.service.healthy() && !server.draining;
      const nlohmann::json status = {{"status", server.draining ? "draining" : healthy ? "ok" : "unavailable"}};
      return {healthy ? http::status::ok : http::status::service_unavailable, status.dump()};
    }
    case Route::metrics:
      return {.body = server.service.metrics_text(), .content_type = "text/plain; version=0.0.4; charset=utf-8"};
    case Route::kv_state:
      return {.body = server.service.kv_state_json()};
    case Route::completions:
    case Route::chat_completions:
      break;
  }
  throw std::logic_error("generation is not a plain answer");
}

// Whether a path needs an API key (when keys are configured): the API under /v1 and the tokenizer's, and /metrics
// if so configured.
bool needs_key(const ServerOptions& options, std::string_view path) {
  return path == "/v1" || path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize" ||
         (options.metrics_require_key && path == "/metrics");
}

// Why the request may not use the path, as the OpenAI API answers it, or none.
std::optional<ApiError> authorization_error(const ServerContext& server, const Request& request,
                                            std::string_view path) {
  if (server.keys.empty() || !needs_key(server.options, path)) return std::nullopt;
  auto header = request.find(http::field::authorization);
  if (header == request.end()) {
    return ApiError(401, "invalid_request_error",
                    "You didn't provide an API key. You need to provide your API key in an Authorization header "
                    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                    "", "invalid_api_key");
  }
  if (server.keys.accepts(header->value())) return std::nullopt;
  return ApiError(401, "invalid_request_error", "Incorrect API key provided.", "", "invalid_api_key");
}

// One connection: read a request, answer it, repeat while keep-alive. Lives in its coroutine's frame on its own
// strand; every read and write has a deadline.
class Session {
 public:
  Session(ServerContext& server, tcp::socket socket) : server_(server), stream_(std::move(socket)) {}

  net::awaitable<void> run();

 private:
  net::awaitable<bool> wait_for_next_request();
  net::awaitable<bool> handle(Request& request);
  net::awaitable<bool> respond(Request& request);
  net::awaitable<bool> dispatch(Request& request);
  void log_access(const Request& request, std::chrono::steady_clock::time_point started) const;
  net::awaitable<bool> answer_error(const Request& request, const ApiError& error, http::field field,
                                    std::string_view value);
  net::awaitable<bool> serve_generation(Request& request, ApiDialect dialect);
  net::awaitable<bool> collect(const Request& request, const ResponseContext& context, EventQueueSink& sink,
                               net::steady_timer& timer, SinkLease& lease);
  net::awaitable<bool> stream(const Request& request, const ResponseContext& context, EventQueueSink& sink,
                              net::steady_timer& timer, SinkLease& lease);
  net::awaitable<bool> wait_for_events(EventQueueSink& sink, net::steady_timer& timer);
  bool peer_closed();
  net::awaitable<bool> do_write(Response& response);
  net::awaitable<bool> do_write_stream_header(const Request& request);
  net::awaitable<bool> do_write_stream_data(std::string_view data);
  net::awaitable<void> do_write_stream_end();
  net::awaitable<void> do_linger();

  ServerContext& server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  // Per request:
  bool stream_started_ = false;  // SSE headers are out: errors can only be written as events
  bool stream_chunked_ = false;  // HTTP/1.1 chunked; HTTP/1.0 streams raw until the connection closes
  bool watch_peer_ = true;       // false once the client pipelined data, which makes the socket always readable
  unsigned status_ = 0;          // the status line written (0: none, the client left first)
  std::string request_id_;       // a generation's id ("cmpl-..."), for the access log
};

net::awaitable<void> Session::run() {
  beast::error_code ignored;
  stream_.socket().set_option(tcp::no_delay(true), ignored);  // SSE chunks are small and latency matters
  const ServerOptions& options = server_.options;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(uint32_t(std::min<size_t>(options.max_header_bytes, UINT32_MAX)));
    parser.body_limit(options.max_body_bytes);
    if (!co_await wait_for_next_request()) break;
    stream_.expires_after(options.read_timeout);  // the whole request, from its first byte
    auto [ec, n_read] = co_await http::async_read_header(stream_, buffer_, parser, use_nothrow);
    if (!ec && !parser.is_done()) {
      // curl asks before sending a large body and otherwise waits a second for this answer.
      if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
        http::response<http::empty_body> go_on{http::status::continue_, parser.get().version()};
        std::tie(ec, std::ignore) = co_await http::async_write(stream_, go_on, use_nothrow);
      }
      if (!ec) std::tie(ec, n_read) = co_await http::async_read(stream_, buffer_, parser, use_nothrow);
    }
    if (ec == http::error::body_limit || ec == http::error::header_limit) {
      bool body = ec == http::error::body_limit;
      ApiError error = body ? ApiError(413, "invalid_request_error",
                                       "request body exceeds " + std::to_string(options.max_body_bytes) + " bytes",
                                       "", "request_too_large")
                            : ApiError(431, "invalid_request_error",
                                       "request headers exceed " + std::to_string(options.max_header_bytes) + " bytes",
                                       "", "headers_too_large");
      unsigned version = parser.is_header_done() ? parser.get().version() : 11;
      server_.service.record_error(error.http_status());
      Response response = error_response(version, false, error);
      if (co_await do_write(response)) co_await do_linger();
      break;
    }
    if (ec && ec.category() == http::make_error_code(http::error::bad_target).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      server_.service.record_error(400);
      Response response =
          error_response(11, false, ApiError(400, "invalid_request_error", "malformed HTTP request: " + ec.message()));
      if (co_await do_write(response)) co_await do_linger();
      break;
    }
    if (ec) break;  // the client closed, timed out or reset
    Request request = parser.release();
    if (!co_await handle(request)) break;
  }
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

// Waits up to the idle timeout for the next request to begin (unless its bytes are already buffered). Returns
// false when the connection is to close: the client closed it, or stayed idle too long.
net::awaitable<bool> Session::wait_for_next_request() {
  if (buffer_.size() > 0) co_return true;
  stream_.expires_after(server_.options.idle_timeout);
  auto [ec, n_read] = co_await stream_.async_read_some(buffer_.prepare(4096), use_nothrow);
  if (ec) co_return false;
  buffer_.commit(n_read);
  co_return true;
}

// Answers one request, and logs it when server.access_log. Returns whether the connection may carry another one.
net::awaitable<bool> Session::handle(Request& request) {
  const auto started = std::chrono::steady_clock::now();
  status_ = 0;
  request_id_.clear();
  const bool keep_alive = co_await respond(request);
  if (server_.options.access_log) log_access(request, started);
  co_return keep_alive;
}

// One line: the client, the request line (its printable ASCII), the status ("-" where the client left before it),
// the time to the end of the answer, and a generation's id.
void Session::log_access(const Request& request, std::chrono::steady_clock::time_point started) const {
  beast::error_code ec;
  const tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
  const std::string client = ec ? "-" : peer.address().to_string() + ":" + std::to_string(peer.port());
  std::string line = std::string(request.method_string()) + " " + std::string(request.target().substr(0, 256));
  for (char& c : line) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  const std::string status = status_ ? std::to_string(status_) : "-";
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::fprintf(stderr, "strata http: %s \"%s\" %s %.3fs%s%s\n", client.c_str(), line.c_str(), status.c_str(), seconds,
               request_id_.empty() ? "" : " ", request_id_.c_str());
}

net::awaitable<bool> Session::respond(Request& request) {
  stream_started_ = false;
  watch_peer_ = true;
  if (server_.draining) request.keep_alive(false);  // clients go elsewhere for their next request
  std::optional<ApiError> error;
  try {
    co_return co_await dispatch(request);
  } catch (const ApiError& e) {
    error = e;
  } catch (const std::exception& e) {
    error = ApiError::internal(e.what());
  } catch (...) {
    error = ApiError::internal("unknown exception");
  }
  // Reached only with an error (no co_await is allowed inside a catch block).
  server_.service.record_error(error->http_status());
  if (error->http_status() >= 500) {
    std::fprintf(stderr, "strata http: %s %s -> %s\n", std::string(request.method_string()).c_str(),
                 std::string(request.target()).c_str(), http_error_status_text(*error).c_str());
  }
  if (stream_started_) {  // the status line is gone; tell the client in the stream and end it
    if (co_await do_write_stream_data(sse_event(error->body()).append(kSseDone))) co_await do_write_stream_end();
    co_return false;
  }
  Response response = error_response(request.version(), request.keep_alive(), *error);
  co_return co_await do_write(response) && request.keep_alive();
}

net::awaitable<bool> Session::dispatch(Request& request) {
  std::string_view target = request.target();
  std::string_view path = target.substr(0, target.find('?'));
  const RouteEntry* entry = nullptr;
  for (const RouteEntry& candidate : kRoutes) {
    if (matches(candidate, path)) entry = &candidate;
  }
  unsigned version = request.version();
  bool keep_alive = request.keep_alive();
  if (auto error = authorization_error(server_, request, path)) {
    co_return co_await answer_error(request, *error, http::field::www_authenticate, "Bearer");
  }
  if (server_.draining && entry && entry->route != Route::health && entry->route != Route::metrics) {
    ApiError error(503, "server_error", "the server is draining before it shuts down; retry on another server", "",
                   "draining");
    co_return co_await answer_error(request, error, http::field::retry_after, kDrainRetryAfterS);
  }
  if (!entry) {
    throw ApiError(404, "not_found_error",
                   "no route for " + std::string(request.method_string()) + " " + std::string(path), "",
                   "unknown_url");
  }
  if (request.method() != entry->method) {
    std::string allowed(http::to_string(entry->method));
    ApiError error(405, "invalid_request_error",
                   std::string(request.method_string()) + " is not allowed on " + std::string(path) + "; use " + allowed,
                   "", "method_not_allowed");
    co_return co_await answer_error(request, error, http::field::allow, allowed);
  }

  if (entry->route == Route::completions) co_return co_await serve_generation(request, ApiDialect::completions);
  if (entry->route == Route::chat_completions) co_return co_await serve_generation(request, ApiDialect::chat);
  PlainAnswer answer = plain_answer(server_, *entry, path, request.body());
  Response response = make_response(version, keep_alive, answer.status, std::move(answer.body), answer.content_type);
  co_return co_await do_write(response) && keep_alive;
}

// An error answer with one header besides the usual ones (Allow, WWW-Authenticate, Retry-After).
net::awaitable<bool> Session::answer_error(const Request& request, const ApiError& error, http::field field,
                                           std::string_view value) {
  server_.service.record_error(error.http_status());
  Response response = error_response(request.version(), request.keep_alive(), error);
  response.set(field, value);
  co_return co_await do_write(response) && request.keep_alive();
}

net::awaitable<bool> Session::serve_generation(Request& request, ApiDialect dialect) {
  std::vector<ParsedCompletion> batch = parse_completion_request(request.body(), dialect, server_.options.limits);
  const std::string id = make_request_id(dialect);
  request_id_ = id;
  for (ParsedCompletion& prompt : batch) {
    encode_prompt(prompt, server_.tokenizer, server_.chat_template, server_.options.limits);
    prompt.request.id = id;
  }
  ResponseContext context = make_response_context(batch, server_.chat_template, unix_now());

  auto sink = std::make_shared<EventQueueSink>();
  std::vector<std::shared_ptr<GenerationSink>> prompt_sinks =
      prompt_batch_sinks(sink, int(batch.size()), context.n_per_prompt);
  net::steady_timer timer(stream_.get_executor());
  SinkLease lease(server_.sinks, sink, timer);  // a batch's prompts submitted before an error are cancelled with it
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].request.sink = std::move(prompt_sinks[i]);
    try {
      server_.service.submit(std::move(batch[i].request));
    } catch (const std::invalid_argument& e) {
      throw ApiError::invalid_request(batch.size() == 1 ? "" : batch[i].prompt_param, e.what());
    } catch (const SubmitRefused& e) {
      throw ApiError::refused(e);
    }
  }
  if (batch.front().stream) co_return co_await stream(request, context, *sink, timer, lease);
  co_return co_await collect(request, context, *sink, timer, lease);
}

net::awaitable<bool> Session::collect(const Request& request, const ResponseContext& context, EventQueueSink& sink,
                                      net::steady_timer& timer, SinkLease& lease) {
  CompletionCollector collector(context);
  while (!collector.done()) {
    if (!co_await wait_for_events(sink, timer)) co_return false;  // the client left: the lease cancels
    for (const GenerationEvent& event : sink.take()) {
      if (!collector.done()) collector.add(event);
    }
  }
  lease.finish();
  if (const auto& failure = collector.failure()) {
    throw ApiError::failed(*failure);
  }
  Response response =
      make_response(request.version(), request.keep_alive(), http::status::ok, collector.body(), "application/json");
  co_return co_await do_write(response) && request.keep_alive();
}

net::awaitable<bool> Session::stream(const Request& request, const ResponseContext& context, EventQueueSink& sink,
                                     net::steady_timer& timer, SinkLease& lease) {
  // The status waits for the first event, so that a request the engine fails at once gets a real error status.
  if (!co_await wait_for_events(sink, timer)) co_return false;
  std::deque<GenerationEvent> events = sink.take();
  if (const auto* failed = std::get_if<RequestFailed>(&events.front())) {
    lease.finish();
    throw ApiError::failed(*failed);
  }
  if (!co_await do_write_stream_header(request)) co_return false;
  StreamEncoder encoder(context);
  std::string out = encoder.begin();
  for (;;) {
    // Everything that queued up since the last write goes out as one chunk.
    for (const GenerationEvent& event : events) {
      out += encoder.encode(event);
      if (encoder.done()) break;
    }
    if (encoder.done()) lease.finish();
    if (!out.empty() && !co_await do_write_stream_data(out)) co_return false;
    out.clear();
    if (encoder.done()) break;
    if (!co_await wait_for_events(sink, timer)) co_return false;
    events = sink.take();
  }
  co_await do_write_stream_end();
  co_return stream_chunked_ && request.keep_alive();
}

// Waits until the sink holds events (true) or the client has gone away (false). Runs on the session strand, as
// the sink's wake-ups do: a wake-up posted after the check below finds the wait already started.
net::awaitable<bool> Session::wait_for_events(EventQueueSink& sink, net::steady_timer& timer) {
  for (;;) {
    if (sink.has_events()) co_return true;
    timer.expires_at(net::steady_timer::time_point::max());
    if (!watch_peer_) {
      co_await timer.async_wait(use_nothrow);
      continue;
    }
    // A readable socket means the client closed, reset, or pipelined its next request.
    auto result =
        co_await (timer.async_wait(use_nothrow) || stream_.socket().async_wait(tcp::socket::wait_read, use_nothrow));
    if (result.index() == 1) {
      auto [ec] = std::get<1>(result);
      if (ec || peer_closed()) co_return false;
      watch_peer_ = false;
    }
  }
}

bool Session::peer_closed() {
  tcp::socket& socket = stream_.socket();
  beast::error_code ec;
  socket.non_blocking(true, ec);
  char byte;
  size_t n = socket.receive(net::buffer(&byte, 1), tcp::socket::message_peek, ec);
  beast::error_code ignored;
  socket.non_blocking(false, ignored);
  if (ec == net::error::would_block) return false;
  return ec || n == 0;
}

net::awaitable<bool> Session::do_write(Response& response) {
  status_ = response.result_int();
  stream_.expires_after(server_.options.write_timeout);
  auto [ec, n_written] = co_await http::async_write(stream_, response, use_nothrow);
  co_return !ec;
}

net::awaitable<bool> Session::do_write_stream_header(const Request& request) {
  http::response<http::empty_body> response{http::status::ok, request.version()};
  status_ = response.result_int();
  response.set(http::field::server, kServerName);
  response.set(http::field::content_type, "text/event-stream");
  response.set(http::field::cache_control, "no-cache");
  response.set("X-Accel-Buffering", "no");  // nginx and friends: pass events through unbuffered
  stream_chunked_ = request.version() >= 11;
  response.keep_alive(stream_chunked_ && request.keep_alive());
  response.chunked(stream_chunked_);
  http::response_serializer<http::empty_body> serializer{response};
  stream_.expires_after(server_.options.write_timeout);
  auto [ec, n_written] = co_await http::async_write_header(stream_, serializer, use_nothrow);
  stream_started_ = !ec;
  co_return !ec;
}

net::awaitable<bool> Session::do_write_stream_data(std::string_view data) {
  stream_.expires_after(server_.options.write_timeout);
  beast::error_code ec;
  if (stream_chunked_) {
    std::tie(ec, std::ignore) = co_await net::async_write(stream_, http::make_chunk(net::buffer(data)), use_nothrow);
  } else {
    std::tie(ec, std::ignore) = co_await net::async_write(stream_, net::buffer(data), use_nothrow);
  }
  co_return !ec;
}

net::awaitable<void> Session::do_write_stream_end() {
  if (!stream_chunked_) co_return;
  stream_.expires_after(server_.options.write_timeout);
  co_await net::async_write(stream_, http::make_chunk_last(), use_nothrow);
}

// After an error that ends the connection, read and drop what the client still sends for a moment, so that
// closing with unread input does not reset the connection before the client has read the error.
net::awaitable<void> Session::do_linger() {
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  auto deadline = std::chrono::steady_clock::now() + kLingerTime;
  char scratch[16 << 10];
  for (;;) {
    stream_.expires_at(deadline);
    auto [ec, n_read] = co_await stream_.async_read_some(net::buffer(scratch), use_nothrow);
    if (ec) co_return;
  }
}

// The connection's slot is given back when the session ends.
net::awaitable<void> serve_connection(ServerContext& server, tcp::socket socket,
                                      [[maybe_unused]] ConnectionLimit::Slot slot) {
  Session session(server, std::move(socket));
  try {
    co_await session.run();
  } catch (const std::exception& e) {  // handlers turn their errors into responses; this is a last resort
    std::fprintf(stderr, "strata http: connection failed: %s\n", e.what());
  }
}

// A connection over server.max_connections: a 503 without reading the request, then a short linger so that the
// close does not reset the connection before the client has read the answer.
net::awaitable<void> refuse_connection(ServerContext& server, tcp::socket socket,
                                       [[maybe_unused]] ConnectionLimit::Slot slot) {
  beast::tcp_stream stream(std::move(socket));
  ApiError error(503, "server_error",
                 "the server holds its maximum of " + std::to_string(server.options.max_connections) +
                     " connections; retry later",
                 "", "too_many_connections");
  server.service.record_error(503);
  Response response = error_response(11, false, error);
  response.set(http::field::retry_after, kBusyRetryAfterS);
  stream.expires_after(kRefusalLinger);
  auto [ec, n_written] = co_await http::async_write(stream, response, use_nothrow);
  if (ec) co_return;
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  char scratch[4096];
  for (;;) {
    auto [read_ec, n_read] = co_await stream.async_read_some(net::buffer(scratch), use_nothrow);
    if (read_ec) co_return;
  }
}

void log_accept(const std::string& line) {
  if (!line.empty()) std::fprintf(stderr, "strata http: %s\n", line.c_str());
}

net::awaitable<void> listen(tcp::acceptor& acceptor, ServerContext& server) {
  AcceptBackoff backoff;
  for (;;) {
    // With no slot to serve or refuse a connection, it waits in the backlog rather than being reset.
    while (server.connections.n_open() >= server.connections.max_open() &&
           server.refusals.n_open() >= server.refusals.max_open()) {
      net::steady_timer pause(acceptor.get_executor(), kFullPoll);
      if (auto [ec] = co_await pause.async_wait(use_nothrow); ec) co_return;
    }
    // Each connection gets its own strand: its coroutine and its sinks' wake-ups never run concurrently.
    auto [ec, socket] = co_await acceptor.async_accept(net::make_strand(acceptor.get_executor()), use_nothrow);
    if (ec == net::error::operation_aborted) co_return;
    if (ec) {  // e.g. out of file descriptors: keep serving the open connections, retry after a growing pause
      AcceptBackoff::Decision decision = backoff.on_failure(ec.message(), AcceptBackoff::Clock::now());
      log_accept(decision.log);
      net::steady_timer pause(acceptor.get_executor(), decision.delay);
      co_await pause.async_wait(use_nothrow);
      continue;
    }
    log_accept(backoff.on_success());
    auto executor = socket.get_executor();
    if (std::optional<ConnectionLimit::Slot> slot = server.connections.try_take()) {
      net::co_spawn(executor, serve_connection(server, std::move(socket), std::move(*slot)), net::detached);
    } else if (std::optional<ConnectionLimit::Slot> refusal = server.refusals.try_take()) {
      net::co_spawn(executor, refuse_connection(server, std::move(socket), std::move(*refusal)), net::detached);
    }  // else: a slot was taken since the wait above (only this loop takes slots, so never): the socket closes
  }
}

}  // namespace

struct HttpServer::Impl {
  Impl(ServerOptions options, GenerationService& service, const Tokenizer& tokenizer,
       const ChatTemplate& chat_template)
      : server(std::move(options), service, tokenizer, chat_template) {}

  ServerContext server;  // declared before the io_context: outlives the sessions' coroutine frames
  std::unique_ptr<net::io_context> io_context;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  uint16_t bound_port = 0;
  std::mutex state_mutex;  // start() / stop()
  bool started = false;
};

HttpServer::HttpServer(ServerOptions options, GenerationService& service, const Tokenizer& tokenizer,
                       const ChatTemplate& chat_template)
    : impl_(std::make_unique<Impl>(std::move(options), service, tokenizer, chat_template)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  std::lock_guard lock(impl_->state_mutex);
  if (impl_->started) throw std::logic_error("HttpServer::start called twice");
  const ServerOptions& options = impl_->server.options;
  if (options.threads < 1) throw std::invalid_argument("ServerOptions.threads must be at least 1");
  impl_->io_context = std::make_unique<net::io_context>(options.threads);
  net::io_context& io_context = *impl_->io_context;
  std::string where = options.host + ":" + std::to_string(options.port);
  try {
    tcp::resolver resolver(io_context);
    tcp::endpoint endpoint = *resolver.resolve(options.host, std::to_string(options.port)).begin();
    tcp::acceptor& acceptor = impl_->acceptor.emplace(io_context);
    acceptor.open(endpoint.protocol());
    acceptor.set_option(net::socket_base::reuse_address(true));
    acceptor.bind(endpoint);
    acceptor.listen(net::socket_base::max_listen_connections);
    impl_->bound_port = acceptor.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    impl_->acceptor.reset();
    impl_->io_context.reset();
    throw std::runtime_error("cannot listen on " + where + ": " + e.code().message());
  }
  impl_->started = true;
  net::co_spawn(io_context, listen(*impl_->acceptor, impl_->server), net::detached);
  for (int i = 0; i < options.threads; ++i) {
    impl_->threads.emplace_back([&io_context] {
      for (;;) {
        try {
          io_context.run();
          return;
        } catch (const std::exception& e) {  // a handler threw past its own guards: log and keep serving
          std::fprintf(stderr, "strata http: %s\n", e.what());
        }
      }
    });
  }
}

uint16_t HttpServer::port() const { return impl_->bound_port; }

void HttpServer::start_draining() { impl_->server.draining = true; }

int HttpServer::n_in_flight() const { return impl_->server.sinks.size(); }

void HttpServer::stop() {
  std::lock_guard lock(impl_->state_mutex);
  if (!impl_->io_context) return;
  impl_->io_context->stop();
  for (std::thread& thread : impl_->threads) thread.join();
  impl_->threads.clear();
  // No session runs now. Silence the sinks the engine may still hold, then destroy the sessions with the
  // io_context: their sockets close and their requests are cancelled.
  impl_->server.sinks.cancel_all();
  impl_->acceptor.reset();
  impl_->io_context.reset();
}

}  // namespace strata
