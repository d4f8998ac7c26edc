// Counts and latencies of RPCs by method, from many threads: what
// load_bench reports (p50 and p99 of each call, errors by status code).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace conveyor::bench {

class LoadStats {
 public:
  // One call of `method` that took `seconds` and ended with `status`.
  void Add(const std::string& method, double seconds, const grpc::Status& status);
  // Prints a table: method, calls, errors by code, p50, p99, max (ms).
  void Print(std::ostream& out) const;
  // Error codes seen that are not in `allowed` ("METHOD CODE: count" each).
  std::vector<std::string> Unexpected(const std::set<grpc::StatusCode>& allowed) const;
  int64_t Calls(const std::string& method) const;
  int64_t Ok(const std::string& method) const;  // the calls that succeeded

 private:
  struct Method {
    std::vector<double> seconds;  // the successful calls'
    std::map<grpc::StatusCode, int64_t> errors;
  };
  mutable std::mutex mu_;
  std::map<std::string, Method> methods_;
};

// The status code's name as gRPC spells it (UNAVAILABLE, NOT_FOUND, ...).
std::string CodeName(grpc::StatusCode code);

}  // namespace conveyor::bench
