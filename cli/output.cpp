#include "cli/output.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <iomanip>
#include <set>
#include <sstream>

#include "plan/job_spec.h"

namespace conveyor::cli {

std::string FormatBytes(int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  if (bytes >= (int64_t{1} << 30)) out << bytes / double(1 << 30) << " GiB";
  else if (bytes >= (1 << 20)) out << bytes / double(1 << 20) << " MiB";
  else if (bytes >= (1 << 10)) out << bytes / double(1 << 10) << " KiB";
  else out << bytes << " B";
  return out.str();
}

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || std::isinf(seconds)) return "?";
  long s = std::lround(seconds);
  std::ostringstream out;
  if (s >= 3600) out << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
  else if (s >= 60) out << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else out << std::fixed << std::setprecision(seconds < 10 ? 1 : 0) << seconds << "s";
  return out.str();
}

ProgressPrinter::ProgressPrinter(bool enabled) : enabled_(enabled), tty_(isatty(STDERR_FILENO) == 1) {}

namespace {

// "epoch 2/3: loss 0.4012, test accuracy 86.20%, 11.8s (5083 samples/s)"
std::string EpochLine(const v1::EpochReport& e, int total_epochs) {
  std::ostringstream line;
  line << "epoch " << e.epoch() << "/" << total_epochs << ": loss " << std::fixed << std::setprecision(4)
       << e.mean_loss();
  if (e.has_eval()) {
    line << ", test accuracy " << std::setprecision(2) << 100 * e.eval_accuracy() << "%, test loss "
         << std::setprecision(4) << e.eval_loss();
  }
  if (e.train_seconds() > 0) {
    line << ", " << FormatDuration(e.train_seconds()) << " (" << std::setprecision(0) << e.samples_per_second()
         << " samples/s)";
  } else {
    line << ", time not measured (resumed from a checkpoint at its end)";
  }
  return line.str();
}

}  // namespace

void ProgressPrinter::Update(const v1::JobStatus& s) {
  if (enabled_ && s.state() == v1::JOB_STATE_RECOVERING && !recovering_) {
    Finish();
    std::fprintf(stderr, "recovering: %s\n", s.error().c_str());
    std::fflush(stderr);
  }
  recovering_ = s.state() == v1::JOB_STATE_RECOVERING;
  if (enabled_) {
    // Fewer than printed: a recovery went back to an earlier epoch.
    epochs_printed_ = std::min(epochs_printed_, s.epochs_size());
    for (; epochs_printed_ < s.epochs_size(); ++epochs_printed_) {
      Finish();
      std::fprintf(stderr, "%s\n", EpochLine(s.epochs(epochs_printed_), s.total_epochs()).c_str());
      std::fflush(stderr);
    }
  }
  if (!enabled_ || s.state() != v1::JOB_STATE_RUNNING || s.step() == 0 || s.step() == step_printed_) return;
  auto now = std::chrono::steady_clock::now();
  auto every = tty_ ? std::chrono::milliseconds(250) : std::chrono::milliseconds(2000);
  if (now - last_ < every && s.step() != s.total_steps()) return;
  last_ = now;
  step_printed_ = s.step();
  std::ostringstream line;
  line << "epoch " << s.epoch() << "/" << s.total_epochs() << "  step " << s.step() << "/" << s.total_steps();
  line << "  loss " << std::fixed << std::setprecision(4) << s.loss();
  // The last step's figures: in lr, grad_norm and loss_scale where the
  // series were left out (a watch), else the series' last.
  if (s.has_lr() || s.lrs_size() > 0)
    line << "  lr " << std::scientific << std::setprecision(3) << (s.has_lr() ? s.lr() : s.lrs(s.lrs_size() - 1));
  if (s.has_grad_norm() || s.grad_norms_size() > 0) {
    line << "  grad norm " << std::fixed << std::setprecision(4)
         << (s.has_grad_norm() ? s.grad_norm() : s.grad_norms(s.grad_norms_size() - 1));
  }
  if (s.has_loss_scale() || s.loss_scales_size() > 0) {
    line << "  loss scale " << std::defaultfloat
         << (s.has_loss_scale() ? s.loss_scale() : s.loss_scales(s.loss_scales_size() - 1));
  }
  line << "  " << std::fixed << std::setprecision(0) << s.samples_per_second() << " samples/s"
       << "  ETA " << FormatDuration(s.eta_seconds());
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.str().c_str());
    line_open_ = true;
  } else {
    std::fprintf(stderr, "%s\n", line.str().c_str());
  }
  std::fflush(stderr);
}

void ProgressPrinter::Finish() {
  if (line_open_) std::fprintf(stderr, "\n");
  line_open_ = false;
}

namespace {

nlohmann::json EpochJson(const v1::EpochReport& e) {
  nlohmann::json je = {{"epoch", e.epoch()},
                       {"mean_loss", e.mean_loss()},
                       {"train_seconds", e.train_seconds()},
                       {"samples_per_second", e.samples_per_second()}};
  je["eval_accuracy"] = e.has_eval() ? nlohmann::json(e.eval_accuracy()) : nlohmann::json(nullptr);
  je["eval_loss"] = e.has_eval() ? nlohmann::json(e.eval_loss()) : nlohmann::json(nullptr);
  return je;
}

nlohmann::json StageJson(const v1::StageReport& st) {
  return {{"index", st.index()},
          {"replica", st.replica()},
          {"address", st.address()},
          {"layers", {st.layer_begin(), st.layer_end()}},
          {"device", st.device()},
          {"transport", LinkName(st.transport())},
          {"collectives", CollectiveName(st.collectives())},
          {"num_parameters", st.num_parameters()},
          {"peak_activations", st.peak_activations()},
          {"peak_activation_bytes", st.peak_activation_bytes()},
          {"memory",
           {{"parameter_bytes", st.parameter_bytes()},
            {"gradient_bytes", st.gradient_bytes()},
            {"optimizer_state_bytes", st.optimizer_state_bytes()},
            {"activation_bytes", st.peak_activation_bytes()},
            {"device_peak_bytes", st.device_peak_bytes()}}},
          {"busy_fraction", st.busy_fraction()},
          {"idle_fraction", st.idle_fraction()},
          {"graphed_steps", st.graphed_steps()},
          {"chunks", std::vector<int>(st.chunks().begin(), st.chunks().end())}};
}

}  // namespace

nlohmann::json ToJson(const v1::JobStatus& s) {
  nlohmann::json j;
  j["job_id"] = s.job_id();
  j["name"] = s.name();
  j["state"] = JobStateName(s.state());
  j["error"] = s.error().empty() ? nlohmann::json(nullptr) : nlohmann::json(s.error());
  j["error_code"] = s.error_code().empty() ? nlohmann::json(nullptr) : nlohmann::json(s.error_code());
  j["steps"] = s.step();
  j["total_steps"] = s.total_steps();
  j["losses"] = std::vector<float>(s.losses().begin(), s.losses().end());
  // Each step's learning rate and global gradient norm (before clipping).
  j["lrs"] = std::vector<double>(s.lrs().begin(), s.lrs().end());
  // A norm that is not finite (a step skipped under loss scaling) is null.
  j["grad_norms"] = std::vector<double>(s.grad_norms().begin(), s.grad_norms().end());
  // Loss scaling: each step's scale (empty without it).
  j["loss_scales"] = std::vector<double>(s.loss_scales().begin(), s.loss_scales().end());
  // The loss of the last step done (the job's final loss once it ended).
  if (s.losses_size() > 0) j["final_loss"] = s.losses(s.losses_size() - 1);
  else if (s.step() > 0) j["final_loss"] = s.loss();
  else j["final_loss"] = nullptr;
  j["samples_per_second"] = s.samples_per_second();
  // After the warm-up steps: the steps the device finished between two points
  // at which it had finished every step counted, and the time between them.
  j["steady_samples_per_second"] = s.steady_samples_per_second();
  j["steady_steps"] = s.steady_steps();
  j["steady_seconds"] = s.steady_seconds();
  j["step_seconds"] = std::vector<double>(s.step_seconds().begin(), s.step_seconds().end());
  j["elapsed_seconds"] = s.elapsed_seconds();
  j["eval_accuracy"] = s.has_eval() ? nlohmann::json(s.eval_accuracy()) : nlohmann::json(nullptr);
  j["eval_loss"] = s.has_eval() ? nlohmann::json(s.eval_loss()) : nlohmann::json(nullptr);
  // exp of the mean loss: a language model's perplexity (per token).
  j["eval_perplexity"] = s.has_eval() && s.tokens() ? nlohmann::json(std::exp(s.eval_loss())) : nlohmann::json(nullptr);
  nlohmann::json epochs = nlohmann::json::array();
  for (const auto& e : s.epochs()) epochs.push_back(EpochJson(e));
  j["epochs"] = epochs;
  j["param_digest"] = s.param_digest();
  j["schedule"] = ScheduleName(s.schedule());
  j["micro_batches"] = s.micro_batches();
  j["batch_size"] = s.batch_size();
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& st : s.stages()) stages.push_back(StageJson(st));
  j["stages"] = stages;
  j["theoretical_idle_fraction"] = s.theoretical_idle_fraction();
  j["virtual_stages"] = s.virtual_stages();
  j["checkpoint_step"] = s.checkpoint_step();
  j["recoveries"] = s.recoveries();
  j["lost_servers"] = std::vector<std::string>(s.lost_servers().begin(), s.lost_servers().end());
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : s.events()) events.push_back({{"unix_ms", e.unix_ms()}, {"event", e.text()}});
  j["events"] = events;
  return j;
}

namespace {

// The summary's lines below write into one stream: each keeps the number
// format (fixed, precision) the lines before it left.

// Loss and throughput; with enough steady steps, their median and slowest.
void SummaryProgressLines(const v1::JobStatus& s, std::ostream& out) {
  // A job still going has a latest loss, not a final one.
  out << "  " << (IsTerminal(s.state()) ? "final loss " : "loss ") << std::fixed << std::setprecision(4)
      << (s.losses_size() > 0 ? s.losses(s.losses_size() - 1) : s.loss()) << ", " << std::setprecision(0)
      << s.samples_per_second() << " samples/s";
  if (s.steady_samples_per_second() > 0)
    out << " (" << std::setprecision(1) << s.steady_samples_per_second() << " after the first " << kWarmupSteps
        << " steps)";
  out << "\n";
  // The steady steps' times: a median far under the mean (the rate) says
  // that a few slow steps, not every step, make the difference.
  const int n = s.step_seconds_size() - static_cast<int>(kWarmupSteps);
  if (n >= 3) {
    std::vector<double> t(s.step_seconds().begin() + kWarmupSteps, s.step_seconds().end());
    const auto slowest = std::max_element(t.begin(), t.end());
    const int slowest_step = static_cast<int>(kWarmupSteps) + static_cast<int>(slowest - t.begin()) + 1;
    const double slowest_ms = 1e3 * *slowest;
    std::nth_element(t.begin(), t.begin() + n / 2, t.end());
    out << "  step time after the first " << kWarmupSteps << " steps: median " << std::setprecision(2)
        << 1e3 * t[static_cast<std::size_t>(n / 2)] << " ms, slowest " << slowest_ms << " ms (step " << slowest_step
        << ")\n";
  }
}

// A line for each stage (with replicas, the grid: replica x stage -> server)
// and, where measured, its memory.
void SummaryStageLines(const v1::JobStatus& s, std::ostream& out) {
  const bool replicated = std::any_of(s.stages().begin(), s.stages().end(), [](const auto& st) { return st.replica() > 0; });
  for (const auto& st : s.stages()) {
    out << "  " << (replicated ? "replica " + std::to_string(st.replica()) + " " : "") << "stage " << st.index() << " "
        << st.address() << " layers [" << st.layer_begin() << ", "
        << st.layer_end() << ") " << st.device() << ", " << st.num_parameters() << " params, busy "
        << std::setprecision(0) << 100 * st.busy_fraction() << "%, idle " << 100 * st.idle_fraction()
        << "% (schedule's bubble " << 100 * s.theoretical_idle_fraction() << "%), peak "
        << Plural(st.peak_activations(), "micro-batch") << " held (" << FormatBytes(st.peak_activation_bytes()) << ")";
    if (st.transport() != v1::LINK_NONE) out << ", " << LinkName(st.transport()) << " to next";
    if (st.collectives() != v1::COLLECTIVES_UNSPECIFIED)
      out << ", gradients summed by " << CollectiveName(st.collectives());
    if (st.graphed_steps() > 0) out << ", " << Plural(st.graphed_steps(), "step") << " as CUDA graphs";
    out << "\n";
    if (st.parameter_bytes() > 0) {
      out << "    memory: parameters " << FormatBytes(st.parameter_bytes()) << ", gradients "
          << FormatBytes(st.gradient_bytes()) << ", optimizer state " << FormatBytes(st.optimizer_state_bytes())
          << ", activations " << FormatBytes(st.peak_activation_bytes());
      if (st.device_peak_bytes() > 0) out << "; device peak " << FormatBytes(st.device_peak_bytes());
      out << "\n";
    }
  }
}

// What happened beyond the plain start and end: failures, recoveries, resumes.
void SummaryEventLines(const v1::JobStatus& s, std::ostream& out) {
  bool heading = false;
  for (const auto& e : s.events()) {
    if (!heading) out << "  events:\n";
    heading = true;
    std::time_t t = static_cast<std::time_t>(e.unix_ms() / 1000);
    char when[32];
    std::strftime(when, sizeof when, "%H:%M:%S", std::localtime(&t));
    out << "    " << when << "  " << e.text() << "\n";
  }
}

}  // namespace

std::string Summary(const v1::JobStatus& s) {
  std::ostringstream out;
  out << "job " << s.job_id() << " (" << s.name() << "): " << JobStateName(s.state());
  if (s.elapsed_seconds() > 0) out << " after " << FormatDuration(s.elapsed_seconds()) << " of training";
  out << "\n";
  if (!s.error().empty())
    out << "  error" << (s.error_code().empty() ? "" : " (" + s.error_code() + ")") << ": " << s.error() << "\n";
  if (s.total_steps() > 0) {
    out << "  steps " << s.step() << "/" << s.total_steps() << " (" << Plural(s.total_epochs(), "epoch")
        << "), batch " << s.batch_size() << " in " << Plural(s.micro_batches(), "micro-batch")
        << ", schedule " << ScheduleName(s.schedule());
    if (s.virtual_stages() > 1) out << " with " << s.virtual_stages() << " chunks per stage";
    out << "\n";
  }
  if (s.step() > 0) SummaryProgressLines(s, out);
  if (s.has_eval()) {
    out << "  test accuracy " << std::fixed << std::setprecision(2) << 100 * s.eval_accuracy() << "%, test loss "
        << std::setprecision(4) << s.eval_loss();
    // A language model's perplexity (its loss is per token); a classifier has none.
    if (s.tokens()) out << " (perplexity " << std::defaultfloat << std::setprecision(4) << std::exp(s.eval_loss()) << ")";
    out << "\n";
  }
  for (const auto& e : s.epochs()) out << "  " << EpochLine(e, s.total_epochs()) << "\n";
  SummaryStageLines(s, out);
  if (!s.param_digest().empty()) out << "  param digest " << s.param_digest() << "\n";
  if (s.checkpoint_step() > 0 || s.recoveries() > 0)
    out << "  last complete checkpoint: step " << s.checkpoint_step() << ", recoveries " << s.recoveries() << "\n";
  if (s.lost_servers_size() > 0) {
    out << "  lost for good:";
    for (const std::string& a : s.lost_servers()) out << " " << a;
    out << "; went on over " << s.stages_size() << " stage server(s)\n";
  }
  SummaryEventLines(s, out);
  return out.str();
}

std::string Plural(int64_t n, const std::string& word) {
  if (n == 1) return "1 " + word;
  // "micro-batches", but "epochs" (a hard ch)
  const bool es = word.size() >= 3 && (word.substr(word.size() - 3) == "tch" || word.back() == 's');
  return std::to_string(n) + " " + word + (es ? "es" : "s");
}

std::string StagesLines(const v1::ListStagesReply& stages) {
  std::ostringstream out;
  int reachable = 0, placed = 0;
  std::set<std::string> jobs;
  for (const auto& h : stages.stages()) {
    reachable += h.reachable() ? 1 : 0;
    if (!h.running_job().empty()) {
      ++placed;
      jobs.insert(h.running_job());
    }
  }
  out << "stage servers: " << stages.stages_size() << ", " << reachable << " answering, " << placed << " running "
      << Plural(static_cast<int64_t>(jobs.size()), "job") << ", " << stages.stages_size() - placed << " free\n";
  for (const auto& h : stages.stages()) {
    out << "  " << std::left << std::setw(22) << h.address() << " ";
    if (h.reachable()) {
      out << std::setw(8) << h.device() << " ";
    } else {
      out << h.error() << "; ";
    }
    if (!h.running_job().empty()) {
      out << "runs " << h.running_job();
    } else if (h.reachable()) {
      out << "free" << (h.job_id().empty() ? "" : " (holds the weights of " + h.job_id() + ")");
    } else {
      out << "free";
    }
    out << "\n";
  }
  return out.str();
}

std::string ListLine(const v1::JobStatus& s) {
  std::ostringstream out;
  out << std::left << std::setw(10) << s.job_id() << " " << std::setw(10) << JobStateName(s.state()) << " "
      << std::setw(24) << s.name();
  // A queued job (or one that failed before it started) has no steps yet.
  if (s.total_steps() > 0) out << " step " << s.step() << "/" << s.total_steps();
  if (s.has_eval()) out << "  acc " << std::fixed << std::setprecision(2) << 100 * s.eval_accuracy() << "%";
  if (!s.error().empty()) out << "  " << s.error();
  return out.str();
}

}  // namespace conveyor::cli
