#include "common/command_line.h"

#include <CLI/CLI.hpp>
#include <iostream>

#include "common/logging.h"

namespace conveyor {
namespace {

std::vector<std::string> CommandNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  return names;
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

int UsageError(const CLI::App& app, const std::string& what) {
  std::cerr << app.get_name() << ": error: " << what << "\n"
            << "Run '" << app.get_name() << " --help' for the usage.\n";
  return kExitUsage;
}

int ParseCommandLine(CLI::App& app, int argc, char** argv) {
  const std::vector<std::string> commands = CommandNames(app);
  if (!commands.empty() && argc <= 1) {
    std::cerr << app.help() << "\n" << app.get_name() << ": error: no command given (one of: " << Join(commands)
              << ")\n";
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // An option nobody knows explains the rest (a missing argument, no command).
    for (const CLI::App* in : app.get_subcommands()) {
      for (const std::string& word : in->remaining())
        if (word.rfind("-", 0) == 0) return UsageError(app, in->get_name() + ": unknown option '" + word + "'");
    }
    for (const std::string& word : app.remaining())
      if (word.rfind("-", 0) == 0) return UsageError(app, "unknown option '" + word + "'");
    if (!commands.empty() && app.get_subcommands().empty()) {
      // No command was recognised: the first word that is not an option is the
      // unknown one (options that take a value may come first).
      for (int i = 1; i < argc; ++i) {
        const std::string word = argv[i];
        if (word.rfind("-", 0) == 0) {
          CLI::Option* opt = nullptr;
          try {
            opt = app.get_option(word.substr(0, word.find('=')));
          } catch (const CLI::Error&) {
          }
          if (opt && opt->get_type_size() != 0 && word.find('=') == std::string::npos) ++i;
          continue;
        }
        return UsageError(app, "unknown command '" + word + "' (one of: " + Join(commands) + ")");
      }
      return UsageError(app, "no command given (one of: " + Join(commands) + ")");
    }
    std::string what = e.what();
    const CLI::App* in = app.get_subcommands().empty() ? nullptr : app.get_subcommands().back();
    if (in) what = in->get_name() + ": " + what;
    return UsageError(app, what);
  }
  return -1;
}

void AddMetricsFlags(CLI::App& app, MetricsFlags* flags) {
  app.add_option("--metrics-listen", flags->listen,
                 "HOST:PORT to serve Prometheus metrics on at /metrics (port 0 picks a free port); off by default");
  app.add_option("--metrics-port-file", flags->port_file, "write the metrics endpoint's bound HOST:PORT here");
}

int StartError(const CLI::App& app, const absl::Status& status) {
  if (absl::IsUnavailable(status)) {
    LOG_ERROR("cannot start: ", status.message());
    return kExitFailure;
  }
  return UsageError(app, std::string(status.message()));
}

}  // namespace conveyor
