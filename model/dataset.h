// Training and test data, read deterministically from (seed, step).
//
// The first stage asks for inputs and the last stage for labels of the same
// step; each computes the same sample indices, so input data never crosses the
// network. Training steps walk a permutation of the training split drawn from
// (seed, epoch); the last, incomplete mini-batch of an epoch is dropped. Eval
// batches walk the test split in order, the last one may be smaller.
//
// data: {format: tokens}: each file is a flat array of little-endian uint16
// or uint32 token ids, mapped read-only for the Dataset's lifetime. Sample i
// is the window tokens[i*N : i*N+N] (N = seq_len; windows do not overlap),
// its target tokens[i*N+1 : i*N+N+1]; a file of T tokens has (T-1) / N
// samples, the tail shorter than a window (plus its one target token) is
// dropped. Both come as int64 [B, N].
//
// data: {format: tensors} with a pattern for `train`: the shards it matched
// (DataSpec.train_shards) are one training split, in order, each mapped
// (never read into memory as a whole): the same batches as one file holding
// them one after another.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Conveyor's seed mixer (splitmix64's finaliser over seed + golden * (salt + 1)):
// shuffling draws from MixSeed(seed, 1000 + epoch), dropout from
// DropoutSeed (model/partition.h). docs/models.md gives it in Python.
uint64_t MixSeed(uint64_t seed, uint64_t salt);

class TokenFile;

class Dataset {
 public:
  ~Dataset();

  // Loads what is asked for; NOT_FOUND or INVALID_ARGUMENT names the file.
  static StatusOr<std::unique_ptr<Dataset>> Open(const v1::JobSpec& spec, bool inputs, bool labels);

  int64_t train_size() const { return train_size_; }
  int64_t test_size() const { return test_size_; }
  int64_t StepsPerEpoch() const;
  int64_t EvalBatches() const;
  // Samples in the mini-batch of (phase, step).
  int64_t BatchSize(v1::Phase phase, int64_t step) const;
  // With `replicas: R`: training batches give only replica `replica`'s share
  // of each batch (plan/job_spec.h's ShareOf), so that over an epoch the
  // replicas read every sample once between them. Evaluation batches whole.
  void ReadShare(int replica) { replica_ = replica; }

  // Float inputs [B, ...] and int64 labels [B] of one mini-batch.
  // A batch's inputs and labels, gathered straight into pinned memory when
  // `pinned` (a CUDA LibTorch only), ready for an asynchronous copy.
  at::Tensor Inputs(v1::Phase phase, int64_t step, bool pinned = false);
  at::Tensor Labels(v1::Phase phase, int64_t step, bool pinned = false);
  // The first training sample's input (or target), as the file holds it.
  at::Tensor SampleOf(bool inputs) const;

  // A data file's targets against the job's built-in class loss
  // (cross_entropy, nll, mse on class indices) and the model's output of
  // `output_sample_shape` per sample: int64 class indices, one per output
  // position but the last dimension, each in [0, classes). INVALID_ARGUMENT
  // names the key, the file and the first bad sample, as PyTorch would
  // refuse them at its first step (a [N, 1] target it does not squeeze).
  // Nothing to check (OK) for other data, losses, or targets not loaded.
  Status CheckTargets(const std::vector<int64_t>& output_sample_shape) const;

 private:
  Dataset() = default;
  at::Tensor Indices(v1::Phase phase, int64_t step);

  v1::JobSpec spec_;
  int64_t train_size_ = 0;
  int64_t test_size_ = 0;
  // Images as uint8 (fashion-mnist, scaled on use), float (synthetic), or a
  // data file's own dtypes (tensors, taken as they are).
  at::Tensor train_x_, train_y_, test_x_, test_y_;
  // data.train_shards: each file's inputs and targets (views of its mapping),
  // one after another: shard k holds rows [shard_rows_[k], shard_rows_[k+1])
  // of the training split (train_x_ and train_y_ are shard 0's).
  std::vector<at::Tensor> shard_x_, shard_y_;
  std::vector<int64_t> shard_rows_;
  bool scale_bytes_ = true;
  int replica_ = -1;  // -1: whole batches (one pipeline, the reference)
  // data: {format: tokens}: the mapped files (null otherwise, or no test file).
  std::unique_ptr<TokenFile> train_tokens_, test_tokens_;
  std::mutex mu_;  // guards perms_
  std::map<int64_t, at::Tensor> perms_;  // epoch -> permutation (last two kept)
};

// Reads the header of a gzipped IDX file: its item count. Torch-free.
StatusOr<int64_t> IdxItemCount(const std::string& path);

}  // namespace conveyor
