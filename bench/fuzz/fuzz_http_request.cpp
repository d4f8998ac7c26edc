// libFuzzer target: a request to --metrics-listen (common/text_endpoint.h),
// as the endpoint reads it from any client that connects: every reply must be
// a whole HTTP/1.1 response.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/text_endpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;  // the endpoint reads no more
  const std::string request(reinterpret_cast<const char*>(data), size);
  const std::string reply = conveyor::TextEndpointReply(request, "/metrics", "text/plain; version=0.0.4",
                                                        [] { return std::string("conveyor_up 1\n"); });
  if (reply.compare(0, 9, "HTTP/1.1 ") != 0 || reply.find("\r\n\r\n") == std::string::npos) __builtin_trap();
  return 0;
}
