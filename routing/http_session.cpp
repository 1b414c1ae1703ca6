#include "routing/http_session.h"

#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/asio/experimental/awaitable_operators.hpp>

#include "leader/generation.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "routing/api_error.h"
#include "routing/event_queue_sink.h"
#include "routing/http_routes.h"
#include "routing/openai_protocol.h"
#include "routing/prompt_batch.h"
#include "routing/request_handler.h"

namespace strata {
namespace {

using namespace net::experimental::awaitable_operators;

constexpr std::chrono::seconds kLingerTime{2};  // how long a connection closed after an error still drains input
// Retry-After of the 503s a draining server answers: time for a load balancer's health check to take it out.
constexpr std::string_view kDrainRetryAfterS = "5";

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string http_error_status_text(const ApiError& error) {
  return std::to_string(error.http_status()) + " " + error.type() + ": " + error.what();
}

// One connection: read a request, answer it, repeat while keep-alive. Lives in its coroutine's frame on its own
// strand; every read and write has a deadline.
class Session : ResponseWriter {
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
  // ResponseWriter, for a RequestHandler.
  net::awaitable<bool> write(Response& response) override { return do_write(response); }
  net::awaitable<bool> write_stream_header(const Request& request) override {
    return do_write_stream_header(request);
  }
  net::awaitable<bool> write_stream_data(std::string_view data) override { return do_write_stream_data(data); }
  net::awaitable<bool> write_stream_end(const Request& request) override;

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
      server_.errors.record(error.http_status());
      Response response = error_response(version, false, error);
      if (co_await do_write(response)) co_await do_linger();
      break;
    }
    if (ec && ec.category() == http::make_error_code(http::error::bad_target).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      server_.errors.record(400);
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
  server_.errors.record(error->http_status());
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
  const RouteEntry* entry = find_route(path);
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

  if (server_.handler) co_return co_await server_.handler->answer(request, *entry, path, *this);
  if (entry->route == Route::completions) co_return co_await serve_generation(request, ApiDialect::completions);
  if (entry->route == Route::chat_completions) co_return co_await serve_generation(request, ApiDialect::chat);
  PlainAnswer answer = plain_answer(server_, *entry, path, request.body());
  Response response = make_response(version, keep_alive, answer.status, std::move(answer.body), answer.content_type);
  co_return co_await do_write(response) && keep_alive;
}

// An error answer with one header besides the usual ones (Allow, WWW-Authenticate, Retry-After).
net::awaitable<bool> Session::answer_error(const Request& request, const ApiError& error, http::field field,
                                           std::string_view value) {
  server_.errors.record(error.http_status());
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
      server_.service->submit(std::move(batch[i].request));
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
  co_return co_await write_stream_end(request);
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

net::awaitable<bool> Session::write_stream_end(const Request& request) {
  co_await do_write_stream_end();
  co_return stream_chunked_ && request.keep_alive();
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

}  // namespace

ServerContext::ServerContext(ServerOptions options_in, GenerationService* service_in, RequestHandler* handler_in,
                             const Tokenizer& tokenizer_in, const ChatTemplate& chat_template_in)
    : options(std::move(options_in)),
      service(service_in),
      handler(handler_in),
      tokenizer(tokenizer_in),
      chat_template(chat_template_in),
      started_at(unix_now()),
      keys(options.api_keys),
      connections(options.max_connections) {
  options.limits.vocab_size = tokenizer.vocab_size();
}

net::awaitable<void> serve_connection(ServerContext& server, tcp::socket socket,
                                      [[maybe_unused]] ConnectionLimit::Slot slot) {
  Session session(server, std::move(socket));
  try {
    co_await session.run();
  } catch (const std::exception& e) {  // handlers turn their errors into responses; this is a last resort
    std::fprintf(stderr, "strata http: connection failed: %s\n", e.what());
  }
}

}  // namespace strata
