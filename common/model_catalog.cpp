#include "common/model_catalog.h"

#include <algorithm>
#include <limits>
#include <string>

namespace conveyor {

int NumLayers(const v1::ModelSpec& model) {
  switch (model.kind()) {
    case v1::MODEL_TOY: return 3;
    case v1::MODEL_CONVNET: return 12;
    case v1::MODEL_MLP: return 2 + 2 * model.hidden_size();  // Flatten, (Linear, ReLU)*, Linear
    // conv1, bn1, relu, maxpool, 3 + 4 + 6 + 3 bottlenecks, avgpool, flatten, fc
    case v1::MODEL_RESNET50: return 23;
    case v1::MODEL_GPT: return model.blocks() + 3;  // embedding, blocks, final norm, output layer
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
  return spec.model().kind() == v1::MODEL_GPT ? v1::DTYPE_INT64 : ActivationDType(spec);
}

v1::DType ActivationDType(const v1::JobSpec& spec) {
  return spec.precision() == v1::PRECISION_BF16 ? v1::DTYPE_BFLOAT16 : v1::DTYPE_FLOAT32;
}

std::vector<int64_t> LabelSampleShape(const v1::JobSpec& spec) {
  if (spec.model().kind() == v1::MODEL_GPT) return {spec.model().seq_len()};
  return {};
}

std::vector<int64_t> InputSampleShape(const v1::JobSpec& spec) {
  if (spec.data().kind() == v1::DATA_FASHION_MNIST) return {1, 28, 28};
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

// Depth-first search over the cuts for the stage-aware balance.
class StageBalanceSearch {
 public:
  StageBalanceSearch(const std::vector<double>& costs, int parts, int stages)
      : n_(static_cast<int>(costs.size())), parts_(parts), stages_(stages), prefix_(costs.size() + 1, 0),
        sums_(static_cast<std::size_t>(stages), 0), cut_(static_cast<std::size_t>(parts) - 1) {
    for (std::size_t i = 0; i < costs.size(); ++i) prefix_[i + 1] = prefix_[i] + costs[i];
  }

  // Starts from `cuts` as the best known.
  std::vector<int> Run(std::vector<int> cuts) {
    best_ = cuts;
    Score(cuts, &best_stage_, &best_chunk_);
    Visit(0, 0, 0);
    return best_;
  }

 private:
  static constexpr long kBudget = 4'000'000;  // nodes visited at most

  void Score(const std::vector<int>& cuts, double* stage, double* chunk) const {
    std::vector<double> sums(static_cast<std::size_t>(stages_), 0);
    *chunk = 0;
    for (int c = 0, begin = 0; c < parts_; ++c) {
      const int end = c + 1 < parts_ ? cuts[static_cast<std::size_t>(c)] : n_;
      const double cost = prefix_[end] - prefix_[begin];
      sums[static_cast<std::size_t>(c % stages_)] += cost;
      *chunk = std::max(*chunk, cost);
      begin = end;
    }
    *stage = *std::max_element(sums.begin(), sums.end());
  }

  // Chunk `c` starts at layer `begin`; `chunk_max` so far.
  void Visit(int c, int begin, double chunk_max) {
    if (++visited_ > kBudget) return;
    const std::size_t s = static_cast<std::size_t>(c % stages_);
    const int last_end = n_ - (parts_ - c - 1);  // leave a layer for each later chunk
    for (int end = c + 1 < parts_ ? begin + 1 : n_; end <= last_end; ++end) {
      const double cost = prefix_[end] - prefix_[begin];
      const double stage = sums_[s] + cost;
      // Costs only grow with `end`: once past the best, later ends are too.
      if (stage > best_stage_ + kSlack || (stage >= best_stage_ - kSlack && std::max(chunk_max, cost) >= best_chunk_))
        break;
      sums_[s] = stage;
      if (c + 1 == parts_) {
        const double worst = *std::max_element(sums_.begin(), sums_.end());
        const double chunk = std::max(chunk_max, cost);
        if (worst < best_stage_ - kSlack || (worst <= best_stage_ + kSlack && chunk < best_chunk_)) {
          best_stage_ = worst;
          best_chunk_ = chunk;
          best_ = cut_;
        }
      } else {
        cut_[static_cast<std::size_t>(c)] = end;
        Visit(c + 1, end, std::max(chunk_max, cost));
      }
      sums_[s] -= cost;
    }
  }

  static constexpr double kSlack = 1e-12;
  const int n_, parts_, stages_;
  std::vector<double> prefix_;
  std::vector<double> sums_;  // per stage, of the chunks placed so far
  std::vector<int> cut_;      // the cut being built
  std::vector<int> best_;
  double best_stage_ = 0, best_chunk_ = 0;
  long visited_ = 0;
};

}  // namespace

std::vector<int> BalancedBoundaries(const std::vector<double>& costs, int parts, int stages) {
  std::vector<int> cuts = BalancedBoundaries(costs, parts);
  if (stages >= parts || stages < 1) return cuts;  // one chunk per stage: the same thing
  return StageBalanceSearch(costs, parts, stages).Run(std::move(cuts));
}

}  // namespace conveyor
