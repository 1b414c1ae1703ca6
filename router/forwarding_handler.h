#pragma once
// What answers the router's requests (routing/request_handler.h): /health and /metrics are its own; every other
// route goes to one replica. A generation request goes where its prompt's prefix most likely is cached
// (router/replica_choice.h); the others to the least loaded replica. A request that fails before anything of its
// answer reached the client (no connection, no answer, a 503, a stream that broke before its first event) is
// retried on the next replica; a stream cut after that ends with an error event, as the server's own do.
#include <atomic>
#include <cstddef>
#include <optional>
#include <string>

#include "router/prefix_route_index.h"
#include "router/prompt_chain.h"
#include "router/replica_set.h"
#include "router/router_metrics.h"
#include "router/router_options.h"
#include "routing/request_handler.h"

namespace strata {

class ChatTemplate;
class Tokenizer;
class UpstreamConnection;

class ForwardingHandler : public RequestHandler {
 public:
  // Everything given must outlive the handler.
  ForwardingHandler(const RouterOptions& options, ReplicaSet& replicas, PrefixRouteIndex& index,
                    RouterMetrics& metrics, const Tokenizer& tokenizer, const ChatTemplate& chat_template);

  net::awaitable<bool> answer(Request& request, const RouteEntry& route, std::string_view path,
                              ResponseWriter& writer) override;
  // /health says "draining" (the session refuses the API itself).
  void start_draining() { draining_ = true; }
  // Requests being forwarded.
  int n_in_flight() const { return n_in_flight_; }

 private:
  // How one replica's attempt ended: answered (and whether the connection may carry another request), or not,
  // keeping a 503 to relay should no replica do better; or a stream cut after it began (why).
  struct Attempt {
    bool answered = false;
    bool keep_alive = false;
    std::optional<Response> refusal;
    std::string cut;

    static Attempt done(bool keep_alive, std::string cut = "") {
      Attempt attempt;
      attempt.answered = true;
      attempt.keep_alive = keep_alive;
      attempt.cut = std::move(cut);
      return attempt;
    }
  };

  Response health_answer(const Request& request) const;
  Response metrics_answer(const Request& request) const;
  net::awaitable<bool> forward(Request& request, const PromptChain& prompt, ResponseWriter& writer);
  net::awaitable<Attempt> attempt(size_t replica, const Request& request, ResponseWriter& writer);
  net::awaitable<Attempt> relay_stream(UpstreamConnection& upstream, const Request& request,
                                       ResponseWriter& writer);

  const RouterOptions& options_;
  ReplicaSet& replicas_;
  PrefixRouteIndex& index_;
  RouterMetrics& metrics_;
  const Tokenizer& tokenizer_;
  const ChatTemplate& chat_template_;
  std::atomic<bool> draining_{false};
  std::atomic<int> n_in_flight_{0};
  std::atomic<size_t> turn_{0};
};

}  // namespace strata
