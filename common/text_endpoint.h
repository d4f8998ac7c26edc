// A plain HTTP/1.1 endpoint that answers GET PATH with a text a callback makes
// (Prometheus's scrape of --metrics-listen): one thread of its own, one
// request per connection, every other path 404 and every other method 405.
//
// Why not prometheus-cpp's Exposer: it serves through civetweb, whose threads
// get a fixed 100 KB stack. glibc puts a process's static TLS on each thread's
// stack, and a stage server that loads OpenBLAS (61 KB of it; Debian's
// libtorch recommends libopenblas0, and the runtime image installs it) has
// more than 100 KB: civetweb's first thread could not be made, and
// --metrics-listen failed with "Possible problem binding to port" (found by
// ctest deploy.containers).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"

namespace conveyor {

// The reply to a request's bytes as read from a client (up to its blank line,
// at most 16 KiB): 200 with `text()` for GET or HEAD of `path`, else 400, 404
// or 405. Apart from the socket for the fuzz target (bench/fuzz).
std::string TextEndpointReply(const std::string& request, const std::string& path, const std::string& content_type,
                              const std::function<std::string()>& text);

class TextEndpoint {
 public:
  // Serves `path` at `address` (HOST:PORT, port 0 picks one) with
  // `content_type`. UNAVAILABLE naming the address when it cannot be bound.
  static StatusOr<std::unique_ptr<TextEndpoint>> Start(const std::string& address, std::string path,
                                                       std::string content_type, std::function<std::string()> text);
  ~TextEndpoint();  // stops serving; a request in progress ends first
  TextEndpoint(const TextEndpoint&) = delete;
  TextEndpoint& operator=(const TextEndpoint&) = delete;

  // The port bound.
  int port() const { return port_; }

 private:
  TextEndpoint() = default;
  void Loop();
  void Answer(int fd);

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a byte written to wake_[1] ends Loop()
  int port_ = 0;
  std::string path_;
  std::string content_type_;
  std::function<std::string()> text_;
  std::thread thread_;
};

}  // namespace conveyor
