#include "plan/model_catalog.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "plan/job_spec.h"
#include "plan/schedule.h"

namespace conveyor {

bool ModelFromFile(const v1::ModelSpec& model) {
  return model.kind() == v1::MODEL_TORCHSCRIPT || model.kind() == v1::MODEL_EXPORTED;
}

int NumLayers(const v1::ModelSpec& model) {
  switch (model.kind()) {
    case v1::MODEL_TOY: return 3;
    case v1::MODEL_CONVNET: return 12;
    case v1::MODEL_MLP: return 2 + 2 * model.hidden_size();  // Flatten, (Linear, ReLU)*, Linear
    // conv1, bn1, relu, maxpool, 3 + 4 + 6 + 3 bottlenecks, avgpool, flatten, fc
    case v1::MODEL_RESNET50: return 23;
    case v1::MODEL_GPT: return model.blocks() + 3;  // embedding, blocks, final norm, output layer
    case v1::MODEL_TORCHSCRIPT:
    case v1::MODEL_EXPORTED: return model.num_layers();  // counted when the job is placed
    default: return 0;
  }
}

int NumClasses(const v1::ModelSpec& model) {
  if (model.num_classes() > 0) return model.num_classes();
  switch (model.kind()) {
    case v1::MODEL_TOY: return 5;
    case v1::MODEL_RESNET50: return 1000;
    case v1::MODEL_GPT: return model.vocab();
    default: return 10;
  }
}

v1::DType InputDType(const v1::JobSpec& spec) {
  const auto& d = spec.data();
  if (d.kind() == v1::DATA_TOKENS) return v1::DTYPE_INT64;
  if (d.kind() == v1::DATA_TENSORS && d.input_dtype() != v1::DTYPE_UNSPECIFIED) {
    // Floating inputs take the job's precision; integers (token ids) stay as they are.
    const bool floating = d.input_dtype() == v1::DTYPE_FLOAT32 || d.input_dtype() == v1::DTYPE_FLOAT64 ||
                          d.input_dtype() == v1::DTYPE_FLOAT16 || d.input_dtype() == v1::DTYPE_BFLOAT16;
    return floating ? ActivationDType(spec) : d.input_dtype();
  }
  return spec.model().kind() == v1::MODEL_GPT ? v1::DTYPE_INT64 : ActivationDType(spec);
}

v1::DType LabelDType(const v1::JobSpec& spec) {
  const auto& d = spec.data();
  if (d.kind() == v1::DATA_TENSORS && d.target_dtype() != v1::DTYPE_UNSPECIFIED) return d.target_dtype();
  return v1::DTYPE_INT64;
}

v1::DType ActivationDType(const v1::JobSpec& spec) {
  return spec.precision() == v1::PRECISION_BF16 ? v1::DTYPE_BFLOAT16 : v1::DTYPE_FLOAT32;
}

std::vector<int64_t> LabelSampleShape(const v1::JobSpec& spec) {
  if (spec.data().kind() == v1::DATA_TOKENS) return {spec.data().seq_len()};
  if (spec.data().kind() == v1::DATA_TENSORS)
    return {spec.data().target_sample_shape().begin(), spec.data().target_sample_shape().end()};
  if (spec.model().kind() == v1::MODEL_GPT) return {spec.model().seq_len()};
  return {};
}

std::vector<int64_t> InputSampleShape(const v1::JobSpec& spec) {
  if (spec.data().kind() == v1::DATA_FASHION_MNIST) return {1, 28, 28};
  if (spec.data().kind() == v1::DATA_TOKENS) return {spec.data().seq_len()};
  if (spec.data().kind() == v1::DATA_TENSORS)
    return {spec.data().input_sample_shape().begin(), spec.data().input_sample_shape().end()};
  switch (spec.model().kind()) {
    case v1::MODEL_TOY: return {10};
    case v1::MODEL_CONVNET: return {1, 28, 28};
    case v1::MODEL_MLP: return {spec.model().input_dim() > 0 ? spec.model().input_dim() : 784};
    case v1::MODEL_RESNET50: return {3, spec.model().image_size(), spec.model().image_size()};
    case v1::MODEL_GPT: return {spec.model().seq_len()};
    default: return {};
  }
}

StatusOr<std::vector<LayerRange>> PartitionLayers(const v1::JobSpec& spec) {
  const int layers = NumLayers(spec.model());
  const auto& part = spec.partition();
  if (part.stages() <= 0) return absl::InvalidArgumentError("partition.stages: must be at least 1");
  const int v = std::max(1, spec.virtual_stages());
  const int stages = part.stages() * v;  // chunks
  if (stages > layers) {
    return absl::InvalidArgumentError(
        "partition.stages: " + std::to_string(part.stages()) + " stages" +
        (v > 1 ? " of " + std::to_string(v) + " chunks" : "") + " but the model has only " +
        std::to_string(layers) + " layers");
  }
  std::vector<int> starts;
  if (part.boundaries_size() > 0) {
    if (part.boundaries_size() != stages - 1) {
      return absl::InvalidArgumentError("partition.boundaries: " + std::to_string(stages) +
                                        " chunks need " + std::to_string(stages - 1) + " boundaries");
    }
    int prev = 0;
    for (int b : part.boundaries()) {
      if (b <= prev || b >= layers) {
        return absl::InvalidArgumentError(
            "partition.boundaries: must increase strictly within 1.." + std::to_string(layers - 1) +
            " (the model has " + std::to_string(layers) + " layers), got " + std::to_string(b));
      }
      starts.push_back(b);
      prev = b;
    }
  } else if (spec.model().kind() == v1::MODEL_RESNET50 && stages == 2) {
    starts.push_back(11);  // the seed's cut: conv1 .. layer2 | layer3 .. fc
  } else {
    for (int s = 1; s < stages; ++s) starts.push_back(s * layers / stages);
  }
  std::vector<LayerRange> ranges;
  int begin = 0;
  for (int start : starts) {
    ranges.push_back({begin, start});
    begin = start;
  }
  ranges.push_back({begin, layers});
  return ranges;
}

std::vector<int> BalancedBoundaries(const std::vector<double>& costs, int parts) {
  // best[k][i]: the least largest range cost of cutting layers [0, i) into k
  // ranges; from[k][i] the start of the last of them. O(parts * n^2), n small.
  const int n = static_cast<int>(costs.size());
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> from(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= parts; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double cost = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (cost < best[k][i]) {
          best[k][i] = cost;
          from[k][i] = j;
        }
      }
    }
  }
  std::vector<int> starts;
  for (int k = parts, i = n; k > 1; --k) {
    i = from[k][i];
    starts.insert(starts.begin(), i);
  }
  return starts;
}

namespace {
constexpr double kExhaustiveCuts = 200'000;  // about a second of simulations at most
}  // namespace

StatusOr<double> SimulateCut(const std::vector<double>& costs, const std::vector<int>& cuts, v1::ScheduleKind kind,
                             int stages, int micro_batches, int virtual_stages, const LinkCosts& link) {
  std::vector<double> forward, backward;
  const bool priced = link.bytes_per_second > 0 && link.output_bytes.size() == costs.size();
  Transfers transfers;  // none unless priced
  if (priced) transfers.latency = link.latency_s;
  for (std::size_t c = 0, begin = 0; c <= cuts.size(); ++c) {
    const std::size_t end = c < cuts.size() ? static_cast<std::size_t>(cuts[c]) : costs.size();
    if (end <= begin || end > costs.size()) return absl::InvalidArgumentError("simulation: a cut out of order");
    double cost = 0;
    for (std::size_t i = begin; i < end; ++i) cost += costs[i];
    forward.push_back(cost / 3);
    backward.push_back(cost * 2 / 3);
    if (priced && c < cuts.size()) transfers.seconds.push_back(link.output_bytes[end - 1] / link.bytes_per_second);
    begin = end;
  }
  return SimulateStep(kind, stages, micro_batches, virtual_stages, forward, backward, transfers);
}

std::vector<int> ScheduledBoundaries(const std::vector<double>& costs, v1::ScheduleKind kind, int stages,
                                     int micro_batches, int virtual_stages, const LinkCosts& link) {
  const int parts = stages * virtual_stages, n = static_cast<int>(costs.size());
  std::vector<int> cuts = BalancedBoundaries(costs, parts);
  if (parts < 2) return cuts;
  auto step = [&](const std::vector<int>& c) {
    auto t = SimulateCut(costs, c, kind, stages, micro_batches, virtual_stages, link);
    return t.ok() ? *t : std::numeric_limits<double>::infinity();
  };
  double best = step(cuts);
  if (!std::isfinite(best)) return cuts;  // a schedule that cannot run this job: its own check says why
  // Every cut, where there are few enough (W2's 27 layers in 4 chunks: 2,600).
  double count = 1;
  for (int k = 1; k < parts; ++k) count = count * (n - k) / k;  // C(n - 1, parts - 1)
  if (count <= kExhaustiveCuts) {
    std::vector<int> trial(cuts.size());
    std::function<void(std::size_t, int)> visit = [&](std::size_t i, int begin) {
      if (i == trial.size()) {
        const double t = step(trial);
        if (t < best * (1 - 1e-9)) {
          best = t;
          cuts = trial;
        }
        return;
      }
      const int last = n - static_cast<int>(trial.size() - i);
      for (int b = begin + 1; b <= last; ++b) {
        trial[i] = b;
        visit(i + 1, b);
      }
    };
    visit(0, 0);
    return cuts;
  }
  // Else coordinate descent: each boundary in turn to its best place between
  // its neighbours, until no move shortens the step.
  for (int round = 0; round < 100; ++round) {
    bool moved = false;
    for (std::size_t i = 0; i < cuts.size(); ++i) {
      const int lo = i == 0 ? 1 : cuts[i - 1] + 1;
      const int hi = i + 1 == cuts.size() ? n - 1 : cuts[i + 1] - 1;
      std::vector<int> trial = cuts;
      for (int b = lo; b <= hi; ++b) {
        trial[i] = b;
        const double t = step(trial);
        if (t < best * (1 - 1e-9)) {
          best = t;
          cuts = trial;
          moved = true;
        }
      }
    }
    if (!moved) break;
  }
  return cuts;
}

}  // namespace conveyor
