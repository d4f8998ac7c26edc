#include "model/zoo_partition.h"

#include <torch/nn/modules/container/sequential.h>

#include "model/models.h"

namespace conveyor {
namespace {

NamedTensors Named(const torch::OrderedDict<std::string, at::Tensor>& dict) {
  NamedTensors out;
  for (const auto& item : dict) out.emplace_back(item.key(), item.value());
  return out;
}

class ZooPartition final : public Partition {
 public:
  explicit ZooPartition(torch::nn::Sequential layers) : seq_(std::move(layers)) {
    // BuildLayers names each child by its model-wide index.
    for (const auto& child : seq_->named_children()) {
      layers_.push_back({std::stoi(child.key()), child.key()});
      children_.push_back(child.value());
    }
  }

  // The zoo's layers take and return one tensor.
  StatusOr<Tensors> Forward(const Tensors& inputs) override {
    if (inputs.size() != 1)
      return absl::InvalidArgumentError("the zoo's layers take one tensor, not " + std::to_string(inputs.size()));
    return Tensors{seq_->forward(inputs.front())};
  }
  NamedTensors LayerParameters(int i) const override {
    return Named(children_[static_cast<std::size_t>(i)]->named_parameters(true));
  }
  NamedTensors LayerBuffers(int i) const override {
    return Named(children_[static_cast<std::size_t>(i)]->named_buffers(true));
  }
  void To(const c10::Device& device, c10::ScalarType dtype) override {
    if (dtype == c10::ScalarType::Undefined) {
      seq_->to(device);
    } else {
      seq_->to(device, dtype);
    }
  }
  void Train(bool on) override { seq_->train(on); }
  bool is_training() const override { return seq_->is_training(); }
  torch::nn::SequentialImpl* sequential() override { return seq_.get(); }

 private:
  torch::nn::Sequential seq_;
  std::vector<std::shared_ptr<torch::nn::Module>> children_;
};

}  // namespace

StatusOr<std::unique_ptr<Partition>> BuildZooPartition(const v1::JobSpec& spec, int begin, int end, bool init) {
  CONVEYOR_ASSIGN_OR_RETURN(torch::nn::Sequential layers, BuildLayers(spec, begin, end, init));
  return std::unique_ptr<Partition>(new ZooPartition(std::move(layers)));
}

}  // namespace conveyor
