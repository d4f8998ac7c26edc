#include "common/metrics.h"

#include <mutex>

#include "common/files.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/text_endpoint.h"

#ifdef CONVEYOR_HAS_PROMETHEUS
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#endif

namespace conveyor::metrics {

const std::vector<Definition>& Definitions() {
  static const std::vector<Definition> table = {
#define CONVEYOR_METRIC_DEFINITION(id, type, name, labels, help) {Id::id, Type::type, name, labels, help},
      CONVEYOR_METRICS(CONVEYOR_METRIC_DEFINITION)
#undef CONVEYOR_METRIC_DEFINITION
  };
  return table;
}

void RecordProcess(const std::string& role) {
  Set(Id::kUp, {{"role", role}}, 1);
  Set(Id::kBuildInfo, {{"role", role}, {"version", CONVEYOR_VERSION}}, 1);
}

void CountRpcError(const std::string& method, const Status& status) {
  if (!status.ok()) Add(Id::kRpcErrors, {{"method", method}, {"code", absl::StatusCodeToString(status.code())}});
}

#ifdef CONVEYOR_HAS_PROMETHEUS
namespace {

// Seconds: a step of a small model on a CPU to a checkpoint of a large one.
const prometheus::Histogram::BucketBoundaries kSecondsBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                                  0.5,   1,      2.5,   5,    10,    30,   60,  120};

// The registry and, per series, the metric that prometheus-cpp made for its
// labels (found again without prometheus-cpp's own hashing of the labels).
class State {
 public:
  State() : registry_(std::make_shared<prometheus::Registry>()) {
    for (const Definition& d : Definitions()) {
      Entry e;
      e.type = d.type;
      switch (d.type) {
        case Type::kCounter:
          e.counters = &prometheus::BuildCounter().Name(d.name).Help(d.help).Register(*registry_);
          break;
        case Type::kGauge:
          e.gauges = &prometheus::BuildGauge().Name(d.name).Help(d.help).Register(*registry_);
          break;
        case Type::kHistogram:
          e.histograms = &prometheus::BuildHistogram().Name(d.name).Help(d.help).Register(*registry_);
          break;
      }
      entries_.push_back(std::move(e));
    }
  }

  // Runs `f` on the metric of (id, labels), made on first use.
  template <typename F>
  void With(Id id, const Labels& labels, F f) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[static_cast<std::size_t>(id)];
    void*& metric = e.series[labels];
    try {
      if (!metric) {
        switch (e.type) {
          case Type::kCounter:
            metric = &e.counters->Add(labels);
            break;
          case Type::kGauge:
            metric = &e.gauges->Add(labels);
            break;
          case Type::kHistogram:
            metric = &e.histograms->Add(labels, kSecondsBuckets);
            break;
        }
      }
      f(e.type, metric);
    } catch (const std::exception&) {
      // A label prometheus-cpp refuses: the series is not kept (never a crash).
      e.series.erase(labels);
    }
  }

  void Forget(Id id, const Labels& match) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[static_cast<std::size_t>(id)];
    for (auto it = e.series.begin(); it != e.series.end();) {
      bool all = true;
      for (const auto& [k, v] : match) {
        auto found = it->first.find(k);
        all = all && found != it->first.end() && found->second == v;
      }
      if (!all) {
        ++it;
        continue;
      }
      switch (e.type) {
        case Type::kCounter:
          e.counters->Remove(static_cast<prometheus::Counter*>(it->second));
          break;
        case Type::kGauge:
          e.gauges->Remove(static_cast<prometheus::Gauge*>(it->second));
          break;
        case Type::kHistogram:
          e.histograms->Remove(static_cast<prometheus::Histogram*>(it->second));
          break;
      }
      it = e.series.erase(it);
    }
  }

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  struct Entry {
    Type type = Type::kCounter;
    prometheus::Family<prometheus::Counter>* counters = nullptr;
    prometheus::Family<prometheus::Gauge>* gauges = nullptr;
    prometheus::Family<prometheus::Histogram>* histograms = nullptr;
    std::map<Labels, void*> series;  // owned by the family
  };
  std::shared_ptr<prometheus::Registry> registry_;
  std::mutex mu_;  // guards entries_' series and the families' Add and Remove
  std::vector<Entry> entries_;  // by Id
};

// Never destroyed: servers end with _Exit, and a thread may still update.
State& Process() {
  static State* state = new State();
  return *state;
}

class PrometheusEndpoint : public MetricsEndpoint {
 public:
  PrometheusEndpoint(std::unique_ptr<TextEndpoint> http, std::string address)
      : http_(std::move(http)), address_(std::move(address)) {}
  const std::string& address() const override { return address_; }

 private:
  std::unique_ptr<TextEndpoint> http_;
  std::string address_;
};

}  // namespace

bool Available() { return true; }

void Add(Id id, const Labels& labels, double value) {
  Process().With(id, labels, [value](Type type, void* m) {
    if (type == Type::kCounter && value > 0) static_cast<prometheus::Counter*>(m)->Increment(value);
  });
}

void Set(Id id, const Labels& labels, double value) {
  Process().With(id, labels, [value](Type type, void* m) {
    if (type == Type::kGauge) static_cast<prometheus::Gauge*>(m)->Set(value);
  });
}

void Observe(Id id, const Labels& labels, double value) {
  Process().With(id, labels, [value](Type type, void* m) {
    if (type == Type::kHistogram) static_cast<prometheus::Histogram*>(m)->Observe(value);
  });
}

void Forget(Id id, const Labels& match) { Process().Forget(id, match); }

std::string Text() { return prometheus::TextSerializer().Serialize(Process().registry()->Collect()); }

StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& address,
                                                                  const std::string& port_file) {
  if (address.empty()) return std::unique_ptr<MetricsEndpoint>();
  CONVEYOR_RETURN_IF_ERROR(CheckAddress(address, "--metrics-listen", /*listen=*/true));
  // Prometheus's text format, served by a thread of our own (common/text_endpoint.h says why).
  auto http = TextEndpoint::Start(address, "/metrics", "text/plain; version=0.0.4; charset=utf-8", [] { return Text(); });
  if (!http.ok()) {
    return Status(http.status().code(), "--metrics-listen: cannot serve metrics: " + std::string(http.status().message()));
  }
  const std::string bound = address.substr(0, address.rfind(':')) + ":" + std::to_string((*http)->port());
  if (!port_file.empty()) CONVEYOR_RETURN_IF_ERROR(WriteFileAtomically(port_file, bound + "\n"));
  LOG_INFO("Prometheus metrics at http://", bound, "/metrics");
  return std::unique_ptr<MetricsEndpoint>(new PrometheusEndpoint(std::move(*http), bound));
}

#else  // no prometheus-cpp

bool Available() { return false; }
void Add(Id, const Labels&, double) {}
void Set(Id, const Labels&, double) {}
void Observe(Id, const Labels&, double) {}
void Forget(Id, const Labels&) {}
std::string Text() { return ""; }

StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& address, const std::string&) {
  if (address.empty()) return std::unique_ptr<MetricsEndpoint>();
  return absl::FailedPreconditionError(
      "--metrics-listen: this build has no Prometheus metrics (prometheus-cpp was not found when CMake configured "
      "it; install prometheus-cpp-dev and configure again)");
}

#endif

}  // namespace conveyor::metrics
