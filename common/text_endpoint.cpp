#include "common/text_endpoint.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace conveyor {
namespace {

constexpr std::size_t kMaxRequestBytes = 16384;
constexpr int kClientMillis = 5000;  // a client that sends no request in time is dropped

void SendAll(int fd, const std::string& data) {
  for (std::size_t sent = 0; sent < data.size();) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<std::size_t>(n);
  }
}

std::string Reply(int code, const char* reason, const std::string& type, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

StatusOr<std::unique_ptr<TextEndpoint>> TextEndpoint::Start(const std::string& address, std::string path,
                                                             std::string content_type,
                                                             std::function<std::string()> text) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError(address + ": not HOST:PORT");
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int r = getaddrinfo(host.empty() ? nullptr : host.c_str(), address.substr(colon + 1).c_str(), &hints, &found);
  if (r != 0) return absl::UnavailableError("cannot resolve " + address + ": " + gai_strerror(r));
  std::unique_ptr<TextEndpoint> e(new TextEndpoint());
  e->listen_fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int on = 1;
  bool ok = e->listen_fd_ >= 0 && setsockopt(e->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0 &&
            bind(e->listen_fd_, found->ai_addr, found->ai_addrlen) == 0 && listen(e->listen_fd_, 16) == 0;
  const int err = errno;
  freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (ok) ok = getsockname(e->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) == 0;
  if (!ok) return absl::UnavailableError("cannot listen on " + address + ": " + std::strerror(err));
  e->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(e->wake_, O_CLOEXEC) != 0) return absl::InternalError(std::string("pipe: ") + std::strerror(errno));
  e->path_ = std::move(path);
  e->content_type_ = std::move(content_type);
  e->text_ = std::move(text);
  e->thread_ = std::thread([raw = e.get()] { raw->Loop(); });
  return e;
}

TextEndpoint::~TextEndpoint() {
  if (thread_.joinable()) {
    const char byte = 0;
    (void)!write(wake_[1], &byte, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void TextEndpoint::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Answer(fd);
    close(fd);
  }
}

void TextEndpoint::Answer(int fd) {
  std::string request;
  char buf[4096];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(p, 2, kClientMillis) <= 0 || p[1].revents) return;  // too slow, or we are stopping
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return;
    request.append(buf, static_cast<std::size_t>(n));
  }
  SendAll(fd, TextEndpointReply(request, path_, content_type_, text_));
}

std::string TextEndpointReply(const std::string& request, const std::string& path, const std::string& content_type,
                              const std::function<std::string()>& text) {
  // "METHOD TARGET HTTP/x.y"; a query string is ignored.
  const auto sp1 = request.find(' ');
  const auto sp2 = sp1 == std::string::npos ? sp1 : request.find(' ', sp1 + 1);
  if (sp2 == std::string::npos) return Reply(400, "Bad Request", "text/plain", "bad request\n");
  const std::string method = request.substr(0, sp1);
  std::string target = request.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  if (target != path) return Reply(404, "Not Found", "text/plain", "not found: try " + path + "\n");
  if (method != "GET" && method != "HEAD") return Reply(405, "Method Not Allowed", "text/plain", "only GET\n");
  std::string reply = Reply(200, "OK", content_type, text());
  if (method == "HEAD") reply = reply.substr(0, reply.find("\r\n\r\n") + 4);
  return reply;
}

}  // namespace conveyor
