#pragma once
// One connection's session (routing/http_session.cpp): read a request (body and header limits, timeouts), check
// its key, route it, answer it (a plain answer, or a generation whole or streamed as server-sent events), repeat
// while keep-alive. And ServerContext, what every session shares.
#include <atomic>
#include <cstdint>

#include "routing/api_keys.h"
#include "routing/connection_limit.h"
#include "routing/request_error_counter.h"
#include "routing/http_messages.h"
#include "routing/http_server.h"
#include "routing/sink_registry.h"

namespace strata {

class ChatTemplate;
class GenerationService;
class RequestHandler;
class Tokenizer;

// What every session shares: the options, the engine (or the handler that answers instead) and tokenizer, the
// keys, the sinks in flight, the bounds on connections and whether the server drains.
struct ServerContext {
  ServerContext(ServerOptions options_in, GenerationService* service_in, RequestHandler* handler_in,
                const Tokenizer& tokenizer_in, const ChatTemplate& chat_template_in);

  ServerOptions options;
  GenerationService* service;  // exactly one of service and handler is set
  RequestHandler* handler;
  const Tokenizer& tokenizer;
  const ChatTemplate& chat_template;
  int64_t started_at = 0;  // unix seconds
  SinkRegistry sinks;
  ApiKeys keys;
  RequestErrorCounter errors;
  ConnectionLimit connections;
  ConnectionLimit refusals{kMaxRefusalsInFlight};
  std::atomic<bool> draining{false};
};

// Serves one accepted connection until it closes; its slot is given back then.
net::awaitable<void> serve_connection(ServerContext& server, tcp::socket socket, ConnectionLimit::Slot slot);

}  // namespace strata
