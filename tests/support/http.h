// A plain HTTP/1.0 GET over loopback for the tests that read Prometheus's
// endpoints (ours and the prometheus server's): header-only, no LibTorch.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <string>

namespace conveyor::testing {

struct HttpReply {
  int code = 0;
  std::string body;
};

// GET http://`host_port``path`; nullopt when the server cannot be reached.
inline std::optional<HttpReply> HttpGet(const std::string& host_port, const std::string& path) {
  const auto colon = host_port.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host_port.substr(0, colon).c_str(), host_port.substr(colon + 1).c_str(), &hints, &found) != 0)
    return std::nullopt;
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool connected = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  if (!connected) {
    if (fd >= 0) close(fd);
    return std::nullopt;
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + host_port + "\r\n\r\n";
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return std::nullopt;
  }
  std::string all;
  char buf[16384];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) all.append(buf, static_cast<std::size_t>(n));
  close(fd);
  HttpReply reply;
  if (all.rfind("HTTP/", 0) != 0 || all.find(' ') == std::string::npos) return std::nullopt;
  reply.code = std::atoi(all.c_str() + all.find(' ') + 1);
  const auto body = all.find("\r\n\r\n");
  if (body != std::string::npos) reply.body = all.substr(body + 4);
  return reply;
}

// `text` with the characters a URL query cannot hold escaped.
inline std::string UrlEncode(const std::string& text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace conveyor::testing
