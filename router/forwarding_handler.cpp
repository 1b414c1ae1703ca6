#include "router/forwarding_handler.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "router/upstream_connection.h"
#include "routing/api_error.h"
#include "routing/openai_protocol.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Counts a request in flight for as long as it lives.
class InFlight {
 public:
  InFlight(std::atomic<int>& count) : count_(count) { ++count_; }
  ~InFlight() { --count_; }

 private:
  std::atomic<int>& count_;
};

class ReplicaRequest {
 public:
  ReplicaRequest(ReplicaSet& replicas, size_t replica) : replicas_(replicas), replica_(replica) {
    replicas_.begin_request(replica_);
  }
  ~ReplicaRequest() { replicas_.end_request(replica_); }

 private:
  ReplicaSet& replicas_;
  size_t replica_;
};

// The length of the events complete in `text` (each ends with a blank line): what can go to the client without
// leaving half an event before an error event.
size_t complete_events(const std::string& text) {
  const size_t end = text.rfind("\n\n");
  return end == std::string::npos ? 0 : end + 2;
}

// A whole answer as the replica gave it: status, body, and the headers a client acts on.
Response relayed(const Request& request, const http::response_header<>& header, std::string body) {
  auto content_type = header[http::field::content_type];
  Response response = make_response(request.version(), request.keep_alive(), header.result(), std::move(body),
                                    content_type.empty() ? "application/json" : content_type);
  for (http::field field : {http::field::retry_after, http::field::www_authenticate, http::field::allow}) {
    if (header.find(field) != header.end()) response.set(field, header[field]);
  }
  return response;
}

}  // namespace

ForwardingHandler::ForwardingHandler(const RouterOptions& options, ReplicaSet& replicas, PrefixRouteIndex& index,
                                     RouterMetrics& metrics, const Tokenizer& tokenizer,
                                     const ChatTemplate& chat_template)
    : options_(options),
      replicas_(replicas),
      index_(index),
      metrics_(metrics),
      tokenizer_(tokenizer),
      chat_template_(chat_template) {}

net::awaitable<bool> ForwardingHandler::answer(Request& request, const RouteEntry& route, std::string_view path,
                                               ResponseWriter& writer) {
  if (route.route == Route::health || route.route == Route::metrics) {
    Response response = route.route == Route::health ? health_answer(request) : metrics_answer(request);
    co_return co_await writer.write(response) && request.keep_alive();
  }
  InFlight in_flight(n_in_flight_);
  PromptChain prompt;
  if (route.route == Route::completions || route.route == Route::chat_completions) {
    const ApiDialect dialect = route.route == Route::chat_completions ? ApiDialect::chat : ApiDialect::completions;
    prompt = prompt_chain(request.body(), dialect, options_.limits, tokenizer_, chat_template_, options_.block_size);
  }
  co_return co_await forward(request, prompt, writer);
}

Response ForwardingHandler::health_answer(const Request& request) const {
  const std::vector<ReplicaView> views = replicas_.views();
  nlohmann::json replicas = nlohmann::json::array();
  bool any_in_service = false;
  for (size_t i = 0; i < views.size(); ++i) {
    const ReplicaView& v = views[i];
    any_in_service = any_in_service || v.in_service;
    replicas.push_back({{"url", replicas_.endpoint(i).url},
                        {"in_service", v.in_service},
                        {"status", v.status},
                        {"in_flight", v.in_flight},
                        {"running", v.load.running},
                        {"waiting", v.load.waiting},
                        {"free_blocks", v.load.free_blocks}});
  }
  const bool ok = any_in_service && !draining_;
  const bool cache_aware = options_.policy == RoutingPolicy::cache_aware;
  const nlohmann::json body = {{"status", draining_ ? "draining" : ok ? "ok" : "unavailable"},
                               {"policy", cache_aware ? "cache_aware" : "round_robin"},
                               {"replicas", replicas}};
  return make_response(request.version(), request.keep_alive(),
                       ok ? http::status::ok : http::status::service_unavailable, body.dump(), "application/json");
}

Response ForwardingHandler::metrics_answer(const Request& request) const {
  metrics_.set_replicas(replicas_.views());
  return make_response(request.version(), request.keep_alive(), http::status::ok, metrics_.render(),
                       "text/plain; version=0.0.4; charset=utf-8");
}

// Tries the replicas in the order of choice until one answers. A generation request's prompt blocks are recorded
// for each replica as it is tried, before it answers, so that the next question on the same document, which may
// follow at once, goes there too.
net::awaitable<bool> ForwardingHandler::forward(Request& request, const PromptChain& prompt, ResponseWriter& writer) {
  const std::vector<int> matched = index_.matched_blocks(prompt.blocks);
  const ReplicaChoice choice =
      choose_replicas(options_.policy, replicas_.views(), matched, options_.busy_threshold, turn_++);
  if (!options_.forward_api_key) request.erase(http::field::authorization);
  request.erase(http::field::expect);
  std::optional<Response> refusal;
  for (size_t i = 0; i < choice.order.size(); ++i) {
    const size_t replica = choice.order[i];
    if (i > 0) metrics_.add_retry();
    if (prompt.n_tokens > 0) index_.record(prompt.blocks, replica);
    Attempt result = co_await attempt(replica, request, writer);
    if (result.answered) {
      if (prompt.n_tokens > 0) metrics_.add_routed_prompt(prompt.n_tokens, matched[replica] * options_.block_size);
      co_return result.keep_alive;
    }
    if (result.refusal) refusal = std::move(result.refusal);
  }
  metrics_.add_unanswered();
  if (refusal) co_return co_await writer.write(*refusal) && request.keep_alive();
  throw ApiError(503, "server_error", "no replica could answer the request; retry later", "",
                 "no_replica_available");
}

// One exchange from connect to the end of the answer; each failure before the answer reached the client is a
// return that lets forward() try the next replica.
net::awaitable<ForwardingHandler::Attempt> ForwardingHandler::attempt(size_t replica, const Request& request,
                                                                      ResponseWriter& writer) {
  ReplicaRequest counted(replicas_, replica);
  const auto started = Clock::now();
  UpstreamConnection upstream(co_await net::this_coro::executor, replicas_.endpoint(replica));
  beast::error_code ec = co_await upstream.send(request, options_.connect_timeout, options_.upstream_timeout);
  if (!ec) ec = co_await upstream.read_header(options_.upstream_timeout);
  if (ec) {
    replicas_.mark_failed(replica);
    metrics_.add_attempt(replica, "failed");
    co_return Attempt{};
  }
  const double first_byte_s = seconds_since(started);
  const unsigned status = upstream.header().result_int();
  const bool streams = status == 200 && upstream.header()[http::field::content_type].starts_with("text/event-stream");
  Attempt result;
  std::string body;
  if (streams) {
    result = co_await relay_stream(upstream, request, writer);
  } else if (!co_await upstream.read_body(body, options_.upstream_timeout)) {
    Response response = relayed(request, upstream.header(), std::move(body));
    if (status == 503) {  // draining, or full: another replica may serve it
      if (response.body().find("\"draining\"") != std::string::npos) replicas_.set_status(replica, "draining");
      result.refusal = std::move(response);
    } else {
      result = Attempt::done(co_await writer.write(response) && request.keep_alive());
    }
  }
  const bool failed = !result.answered && !result.refusal;
  if (failed) replicas_.mark_failed(replica);
  metrics_.add_attempt(replica, failed ? "failed" : !result.cut.empty() ? "cut" : std::to_string(status));
  metrics_.observe_upstream(replica, first_byte_s, seconds_since(started));
  if (!result.cut.empty()) {
    throw ApiError(502, "server_error", "the replica's stream broke off: " + result.cut, "", "upstream_failed");
  }
  co_return result;
}

// A stream: nothing goes to the client before its first whole event has come, so that a replica that fails
// before it leaves the request to the next one; after that, a cut ends the client's stream with an error event.
net::awaitable<ForwardingHandler::Attempt> ForwardingHandler::relay_stream(UpstreamConnection& upstream,
                                                                           const Request& request,
                                                                           ResponseWriter& writer) {
  std::string pending;
  size_t ready = 0;
  while (ready == 0 && !upstream.body_done()) {
    if (co_await upstream.read_body_piece(pending, options_.upstream_timeout)) co_return Attempt{};
    ready = complete_events(pending);
  }
  if (ready == 0) co_return Attempt{};  // the stream ended without an event
  if (!co_await writer.write_stream_header(request)) co_return Attempt::done(false);
  for (;;) {
    if (ready > 0) {
      if (!co_await writer.write_stream_data(std::string_view(pending).substr(0, ready))) {
        co_return Attempt::done(false);
      }
      pending.erase(0, ready);
    }
    if (upstream.body_done()) break;
    if (beast::error_code ec = co_await upstream.read_body_piece(pending, options_.upstream_timeout)) {
      co_return Attempt::done(false, ec.message());
    }
    ready = complete_events(pending);
  }
  co_return Attempt::done(co_await writer.write_stream_end(request));
}

}  // namespace strata
