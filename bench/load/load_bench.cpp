// load_bench: one coordinator under many users, and a stage server under
// malformed and oversized RPCs (docs/operations.md, "Under load";
// bench/load/load.sh runs it all).
//
//   load_bench load --coordinator ADDR --job FILE [--jobs 1000] [--clients 20]
//              [--watchers 100] [--rate 200] [--seconds 60] [--ids-out FILE]
//              [--allow CODE,...]
//     CLIENTS threads submit JOBS jobs at once; WATCHERS threads follow them
//     (WatchJob, a job after another); GetJob and ListJobs at RATE calls a
//     second in all, for SECONDS. Prints each call's p50 and p99 and its
//     errors by code; exits 1 on an error not in --allow.
//   load_bench check --coordinator ADDR --ids FILE
//     Every job id in FILE (one a line) is in ListJobs with a valid state.
//   load_bench abuse --stage ADDR [--clients 16] [--seconds 20]
//     Garbage bytes to the stage server's port, malformed frames to StageData,
//     oversized and malformed StageControl calls; exits 1 if the server stops
//     answering GetInfo.
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "bench/load/load_modes.h"

int main(int argc, char** argv) {
  CLI::App app{"load_bench: a coordinator and a stage server under load"};
  app.require_subcommand(1);
  conveyor::bench::LoadOptions load;
  std::string allow;
  auto* l = app.add_subcommand("load", "submit, watch and poll one coordinator");
  l->add_option("--coordinator", load.coordinator, "HOST:PORT")->required();
  l->add_option("--job", load.job_file, "the job file every job is")->required();
  l->add_option("--jobs", load.jobs)->capture_default_str();
  l->add_option("--clients", load.clients)->capture_default_str();
  l->add_option("--watchers", load.watchers)->capture_default_str();
  l->add_option("--rate", load.rate, "GetJob and ListJobs calls a second, in all")->capture_default_str();
  l->add_option("--seconds", load.seconds)->capture_default_str();
  l->add_option("--ids-out", load.ids_out, "append each job id submitted here, as it is acknowledged");
  l->add_option("--allow", allow, "error codes that are expected (e.g. UNAVAILABLE while the coordinator restarts)");
  std::string coordinator, ids;
  auto* c = app.add_subcommand("check", "every job submitted is in the database with a valid state");
  c->add_option("--coordinator", coordinator, "HOST:PORT")->required();
  c->add_option("--ids", ids, "job ids, one a line")->required();
  conveyor::bench::AbuseOptions abuse;
  auto* a = app.add_subcommand("abuse", "malformed and oversized RPCs to a stage server");
  a->add_option("--stage", abuse.stage, "HOST:PORT")->required();
  a->add_option("--clients", abuse.clients)->capture_default_str();
  a->add_option("--seconds", abuse.seconds)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (l->parsed()) {
    for (std::size_t b = 0; b < allow.size();) {
      std::size_t e = allow.find(',', b);
      if (e == std::string::npos) e = allow.size();
      load.allow.push_back(allow.substr(b, e - b));
      b = e + 1;
    }
    return conveyor::bench::RunLoad(load);
  }
  if (c->parsed()) return conveyor::bench::RunCheck(coordinator, ids);
  return conveyor::bench::RunAbuse(abuse);
}
