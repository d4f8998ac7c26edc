// model/: the model as LibTorch runs it, for the stages and the reference
// alike: the built-in zoo (models.h, blocks.h), models from PyTorch
// (TorchScript archives, torch.export programs), datasets and batch loading,
// losses and optimizers (training.h, optimizer.h), state dicts, device
// settings, and the LibTorch 1.13/2.x differences (compat.h).
//
// This header is the seam between a stage's step code and the model it
// trains: the layers [begin, end) of one model chunk, whatever their source
// (the built-in zoo, a TorchScript archive, a torch.export program). The step
// code sees only this interface.
//
// Layers are the model's top-level children, in order; each has its
// model-wide index and its name (the index for the zoo and for an
// nn.Sequential built from a list, the key for one built from an OrderedDict).
// Parameters and buffers are named as the whole model's state_dict() names
// them: "<layer name>.<name within the layer>".
//
// Not thread-safe: the stage's executor thread owns a Partition.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace torch::nn {
class SequentialImpl;
}  // namespace torch::nn

namespace conveyor {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
// What crosses a stage boundary: one tensor, or the tensors of a tuple in
// order (nn.Sequential passes a layer's output on as one argument).
using Tensors = std::vector<at::Tensor>;

class Partition {
 public:
  virtual ~Partition() = default;

  struct Layer {
    int index = 0;     // in the whole model
    std::string name;  // the child's name in the whole model
  };

  // A micro-batch's input through the layers held, recording autograd where
  // grad mode is on. `inputs` is one tensor, or a tuple's tensors (the first
  // layer gets them as one tuple); the output likewise. INVALID_ARGUMENT
  // naming the layer when the output of one is not what the next takes, or
  // what the last returns cannot cross a stage boundary (docs/models.md).
  virtual StatusOr<Tensors> Forward(const Tensors& inputs) = 0;
  // What the layers' random numbers (dropout) are drawn from in training:
  // before layer i's forward the default generators (CPU, and CUDA on a GPU)
  // are seeded with DropoutSeed(seed, step, micro_batch, layer index), the
  // same in a recomputed forward. Unset (evaluation): left as they are.
  struct RandomKey {
    uint64_t seed = 0;
    int64_t step = 0;
    int micro_batch = 0;
  };
  void SetRandomKey(std::optional<RandomKey> key) { random_key_ = key; }

  // One tensor in, one out (the whole model's input and output):
  // INVALID_ARGUMENT when the layers return a tuple.
  StatusOr<at::Tensor> ForwardOne(const at::Tensor& input);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  int layer_index(int i) const { return layers_[static_cast<std::size_t>(i)].index; }
  const std::string& layer_name(int i) const { return layers_[static_cast<std::size_t>(i)].name; }
  // Layer i's parameters (or buffers), named within the layer.
  virtual NamedTensors LayerParameters(int i) const = 0;
  virtual NamedTensors LayerBuffers(int i) const = 0;

  // Moves parameters and buffers; `dtype` (if not undefined) converts the
  // floating-point ones.
  virtual void To(const c10::Device& device, c10::ScalarType dtype = c10::ScalarType::Undefined) = 0;
  virtual void Train(bool on) = 0;
  virtual bool is_training() const = 0;

  // The zoo's module (CUDA graphs capture its forward); null for others.
  virtual torch::nn::SequentialImpl* sequential() { return nullptr; }

  // Over every layer held, in model order:
  NamedTensors NamedParameters() const;  // "<layer name>.<name>"
  NamedTensors NamedBuffers() const;
  std::vector<at::Tensor> Parameters() const;
  std::vector<at::Tensor> Buffers() const;
  // Raw SHA-256 of layer i: its parameters' and buffers' names, dtypes,
  // shapes and bytes (param_digest combines these in model order).
  std::string LayerDigest(int i) const;

 protected:
  std::vector<Layer> layers_;
  std::optional<RandomKey> random_key_;
};

// The seed of `layer`'s random numbers in micro-batch `micro_batch` of
// training step `step` (0-based): MixSeed(MixSeed(MixSeed(seed, step),
// micro_batch), layer) (docs/models.md).
uint64_t DropoutSeed(uint64_t seed, int64_t step, int micro_batch, int layer);
// Held while a partition seeds the process's default generators and runs the
// layers that draw from them (several stages may share a process: tests).
std::mutex& DefaultGeneratorMutex();

// The layers [begin, end) of the job's model, from the zoo or the job's
// TorchScript archive, on the CPU in the job's precision (`init` false: the
// zoo skips its seeded initialisation, for probing and timing).
StatusOr<std::unique_ptr<Partition>> BuildPartition(const v1::JobSpec& spec, int begin, int end, bool init = true);

// Job key memory_format: whether the job's 4-D tensors are kept channels-last
// on `device` (auto: on CUDA, for the zoo's convolutional models).
bool UsesChannelsLast(const v1::JobSpec& spec, const c10::Device& device);
// Converts the 4-D parameters and buffers held (convolution weights) to
// channels-last memory in place, as PyTorch's model.to(memory_format=
// torch.channels_last): once, where the layers are placed, before an
// optimizer holds them.
void ToChannelsLast(Partition& layers);

// init_from's keys must all name the model's parameters or buffers (what
// load_state_dict(strict=True) calls unexpected keys): INVALID_ARGUMENT.
Status CheckInitialWeightNames(const v1::JobSpec& spec, const NamedTensors& weights);
// Copies init_from's tensors into `layers` by name: every parameter and
// buffer held must be there with its shape (a missing or mis-shaped one:
// INVALID_ARGUMENT naming it).
Status LoadInitialWeights(const v1::JobSpec& spec, const NamedTensors& weights, Partition& layers);

// What the files of a job (its paths resolved) hold: the model's layers (a
// TorchScript archive is read) and a data file's per-sample shapes and dtypes.
// ApplyDescription (common/job_spec.h) puts it into the spec.
StatusOr<v1::DescribeReply> DescribeJob(const v1::JobSpec& spec);

}  // namespace conveyor
