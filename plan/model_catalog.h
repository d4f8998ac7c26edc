// What the coordinator must know of a model without building it: its number of
// layers and the per-sample shape of its input. Torch-free. common/models.h
// builds the layers themselves; a test checks that both agree.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

int NumLayers(const v1::ModelSpec& model);
// A model read from the user's file (TorchScript or an exported program),
// whose layers are counted when the job is placed.
bool ModelFromFile(const v1::ModelSpec& model);

// dtype of the model's input (int64 tokens for gpt, else float32), and of the
// activations and parameters (the job's precision).
v1::DType InputDType(const v1::JobSpec& spec);
v1::DType ActivationDType(const v1::JobSpec& spec);
// dtype of the targets the last stage reads: int64 classes or tokens, or the
// data file's own.
v1::DType LabelDType(const v1::JobSpec& spec);

// Per-sample shape of the labels: {} for a class, {seq_len} for gpt's tokens.
std::vector<int64_t> LabelSampleShape(const v1::JobSpec& spec);

int NumClasses(const v1::ModelSpec& model);

// Per-sample input shape: toy {10}, convnet {1, 28, 28}, mlp {input_dim}
// (Fashion-MNIST's {1, 28, 28} for mlp too: its first layer flattens),
// resnet50 {3, size, size}, gpt {seq_len}.
std::vector<int64_t> InputSampleShape(const v1::JobSpec& spec);

// Contiguous layer ranges, one per model chunk: stages x virtual_stages of
// them (chunk c runs on stage c % stages).
struct LayerRange {
  int begin = 0;
  int end = 0;  // exclusive
};

// From `partition`: explicit boundaries, or near-equal layer counts (resnet50
// on 2 stages: the seed's cut between layer2 and layer3).
// INVALID_ARGUMENT when a chunk would be empty.
StatusOr<std::vector<LayerRange>> PartitionLayers(const v1::JobSpec& spec);

// Cuts `costs` (one per layer, in order) into `parts` contiguous non-empty
// ranges so that the costliest range costs as little as possible; returns the
// first layer of ranges 2..parts. REQUIRES: 1 <= parts <= costs.size().
std::vector<int> BalancedBoundaries(const std::vector<double>& costs, int parts);

// The step SimulateStep (common/schedule.h) gives the cut `cuts` (first layers
// of chunks 2..) of layers costing `costs`, each layer a third forward and two
// thirds backward: how ScheduledBoundaries compares cuts.
// partition.link_gbps: what crosses a cut after each layer (one micro-batch's
// output, bytes; one per layer), and the link's bytes a second (0: free) and
// latency in seconds.
struct LinkCosts {
  std::vector<double> output_bytes;
  double bytes_per_second = 0;
  double latency_s = 0;
};
StatusOr<double> SimulateCut(const std::vector<double>& costs, const std::vector<int>& cuts, v1::ScheduleKind kind,
                             int stages, int micro_batches, int virtual_stages, const LinkCosts& link = {});

// The cut into stages * virtual_stages chunks (chunk c on stage c % stages)
// whose step under `kind` with `micro_batches` is shortest by SimulateStep
// (common/schedule.h), each layer's cost being a third forward and two thirds
// backward: what the bubbles and an interleaved schedule's order make of
// uneven chunks, which neither the costliest chunk nor the costliest stage's
// sum says alone. Every cut where there are at most 200,000, else coordinate
// descent started from BalancedBoundaries' cut; never slower than that cut in
// the simulation.
// REQUIRES: stages * virtual_stages <= costs.size().
// With `link`, each cut's transfers take their time in the simulation too.
std::vector<int> ScheduledBoundaries(const std::vector<double>& costs, v1::ScheduleKind kind, int stages,
                                     int micro_batches, int virtual_stages, const LinkCosts& link = {});

}  // namespace conveyor
