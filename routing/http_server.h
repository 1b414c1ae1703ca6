#pragma once
// The HTTP/1.1 front end (Boost.Beast): OpenAI-compatible completions and chat (whole or streamed as server-sent
// events), /v1/models, /health, /metrics, /v1/kv_state. Requests are parsed, tokenized and validated here, then
// handed to the GenerationService; its events come back through a per-request sink that never blocks the engine.
// One file per part: the listener and the I/O threads (http_server.cpp), a connection's session (http_session.cpp),
// the routes (http_routes.cpp), the sink that wakes a session (event_queue_sink.cpp) and the registry of the sinks
// in flight (sink_registry.cpp). Beast stays in those (routing/http_messages.h): this header is cheap to include.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "routing/protocol_limits.h"

namespace strata {

class ChatTemplate;
class GenerationService;
class RequestHandler;
class Tokenizer;

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;                          // 0: an ephemeral port, see HttpServer::port()
  int threads = 2;                               // I/O threads; handlers parse and tokenize on them
  size_t max_body_bytes = 4 << 20;               // larger bodies get 413
  size_t max_header_bytes = 16 << 10;            // larger headers get 431
  std::chrono::seconds read_timeout{30};         // one whole request, from its first byte
  std::chrono::seconds idle_timeout{15};         // a connection's wait for the first byte of its next request
  std::chrono::seconds write_timeout{30};        // each response write (each chunk when streaming)
  // What a request may ask for; model_name is also the id /v1/models lists. vocab_size is the tokenizer's,
  // whatever is set here.
  ProtocolLimits limits;
  int max_connections = 512;                     // connections held at once; more get 503 and are closed
  bool access_log = false;                       // one stderr line per request (server.access_log, on in strata serve)
  std::vector<std::string> api_keys;             // bearer keys for /v1/* (routing/api_keys.h); none: open
  bool metrics_require_key = false;              // whether /metrics needs a key too
};

class HttpServer {
 public:
  // The service, tokenizer and template must outlive the server.
  HttpServer(ServerOptions options, GenerationService& service, const Tokenizer& tokenizer,
             const ChatTemplate& chat_template);
  // A server whose every route the handler answers (routing/request_handler.h: strata route); the session still
  // reads, checks keys, refuses while draining and routes. /health and /metrics go to the handler too.
  HttpServer(ServerOptions options, RequestHandler& handler, const Tokenizer& tokenizer,
             const ChatTemplate& chat_template);
  ~HttpServer();  // stops
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the I/O threads. Throws std::runtime_error naming host:port when it cannot bind.
  void start();
  // The bound port (the ephemeral one when options.port was 0); valid after start().
  uint16_t port() const;
  // Stops admitting (a graceful drain): /v1/* gets 503 with Retry-After, /health 503 with status "draining" so that
  // load balancers stop sending; the requests in flight go on, and each connection closes after its response.
  // Idempotent.
  void start_draining();
  // Generation requests whose response is not yet completely written (a handler's server: none, the handler
  // counts its own).
  int n_in_flight() const;
  // Closes the listener and every connection and joins the threads; requests in flight are cancelled (their
  // sinks report cancelled()). Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
