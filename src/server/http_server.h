// The coordinator on the network: HTTP/1.1 (keep-alive, pipelined requests answered in order)
// with Boost.Beast, optionally TLS: transport only. I/O threads parse requests and hand them to
// the engine thread, which steps the Coordinator (server/coordinator.h: it owns the Engine, no
// lock inside it) with every request waiting, and hands each wave to the commit thread, which
// writes it to the journal and only then sends its replies. With one I/O thread (the default)
// that thread is the engine thread too; with several, the engine has its own and takes
// requests through one queue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/engine.h"
#include "core/error.h"
#include "journal/journal.h"
#include "server/api.h"
#include "server/auth.h"
#include "server/leadership.h"
#include "server/server_clock.h"

namespace traincoord {

class Coordinator;

// TLS for the listening socket. Empty cert_file: plain HTTP.
struct TlsOptions {
  std::string cert_file;       // PEM: the server's certificate (chain)
  std::string key_file;        // PEM: its private key
  std::string client_ca_file;  // PEM CA bundle; set: every client must show a certificate it signed
  bool enabled() const { return !cert_file.empty(); }
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8470;  // 0: any free port (start() says which)
  int io_threads = 1;
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 16 << 10;
  int idle_timeout_s = 600;         // a connection with no request for this long is closed
  int read_timeout_s = 30;          // a request must arrive whole this long after its first byte
  size_t max_connections = 20'000;  // more are closed at once
  uint64_t max_requests_per_connection = 1'000'000;  // then the reply says Connection: close
  ApiLimits limits;
  Auth* auth = nullptr;  // null: no tokens needed (loopback demos); else checked first
  TlsOptions tls;
  // High availability (docs/HA.md): null: this server alone serves its runs. Else it answers
  // run requests only while it leads (421 not_leader otherwise), and when a write fails (etcd
  // refused it: another coordinator leads; or etcd could not be reached) it steps down: the
  // wave's replies and every later one are dropped, never sent.
  Leadership* leadership = nullptr;
};

class HttpServer {
 public:
  // REQUIRES: `engine`, `clock` (the engine's clock) and `journal` outlive the server. From
  // start() on, only the server's engine thread touches the engine and the clock, through its
  // Coordinator (server/coordinator.h): the I/O thread itself when there is one (io_threads ==
  // 1), else a thread of its own; the journal is written by the commit thread. With a journal,
  // every state change is durable before its reply is sent; without one (nullptr), the state
  // lives in memory only.
  HttpServer(Engine& engine, ServerClock& clock, Journal* journal, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Loads the TLS certificates (if any), binds, listens and starts the threads. Returns the
  // port it listens on, or an error that says why it could not (address in use, bad address,
  // unreadable certificate or key, a key that does not match its certificate).
  Result<uint16_t> start();
  // Blocks until stop() is called (from another thread or a signal handler's thread).
  void wait();
  // Stops accepting, closes every connection and joins the threads. Idempotent.
  void stop();
  // Runs `task` on the engine thread, within a tick (Coordinator::post): high availability
  // adds the runs it takes over to the engine so, while serving the others.
  void post(std::function<void(Coordinator&)> task);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace traincoord
