#pragma once
// strata route's parts, assembled: the replicas and their health checks, the index of what each was sent, the
// metrics, and routing/'s HTTP server answering through the forwarding handler (router/forwarding_handler.h).
#include <cstdint>
#include <memory>

#include "router/router_options.h"
#include "routing/http_server.h"

namespace strata {

class ChatTemplate;
class Tokenizer;

class Router {
 public:
  // Throws std::invalid_argument naming a replica URL that cannot be used. The tokenizer and template (the
  // replicas' model's) must outlive the router.
  Router(RouterOptions options, ServerOptions server_options, const Tokenizer& tokenizer,
         const ChatTemplate& chat_template);
  ~Router();  // stops

  // Starts the health checks and the server (throws std::runtime_error when it cannot listen).
  void start();
  uint16_t port() const;
  // Refuses new requests (503) and says "draining" on /health; those in flight go on.
  void start_draining();
  int n_in_flight() const;
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
