// Command lines of the three programs: one exit-code convention and one way
// of answering a usage error.
//
// Exit codes (docs/operations.md lists them for every program):
//   0  success (for `conveyor`, the job or command succeeded)
//   1  failure at run time: a job that failed, a server that could not start
//      (address in use, state folder locked), an error from the coordinator
//   2  usage: an unknown option or command, a missing or malformed argument
//   130, 143  interrupted by SIGINT or SIGTERM (`conveyor local`)
#pragma once

#include <string>

#include "absl/status/status.h"
#include <vector>

namespace CLI {
class App;
}

namespace conveyor {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// Parses argv with `app`. Returns -1 when the program should go on; otherwise
// the exit code: 0 after --help (printed on stdout), kExitUsage after a usage
// error, printed on stderr as "PROGRAM: error: WHAT" and a line pointing to
// --help. For a program with subcommands, no command prints the help with the
// list of commands, and an unknown one names itself and the commands.
int ParseCommandLine(CLI::App& app, int argc, char** argv);

// "PROGRAM: error: WHAT" and the --help hint on stderr; returns kExitUsage.
int UsageError(const CLI::App& app, const std::string& what);

// The servers' Prometheus endpoint (common/metrics.h): off unless --metrics-listen.
struct MetricsFlags {
  std::string listen;     // HOST:PORT; "" : no endpoint
  std::string port_file;  // the bound HOST:PORT is written here
};
void AddMetricsFlags(CLI::App& app, MetricsFlags* flags);

// A server that could not start a listener of a flag's: UNAVAILABLE (an
// address in use) is logged and gives kExitFailure, anything else (a bad
// address, a build without the feature) is a usage error.
int StartError(const CLI::App& app, const absl::Status& status);

}  // namespace conveyor
