// The job keys of devices and links: how tensors travel between stages, what
// NCCL and matmuls may use of the SMs, CUDA graphs, steps in flight, memory
// format, cuDNN and profiling.
#include "plan/job_key_rows.h"

#include <yaml-cpp/yaml.h>

#include <string>

#include "plan/job_spec.h"

namespace conveyor::job_keys_internal {
namespace {

Status ReadCarveout(const YAML::Node& node, S* s) {
  int64_t sms = 0;
  std::string word;
  const bool number = ReadScalar(node, &sms);
  if (!number) ReadScalar(node, &word);
  if (word == "auto") {
    s->set_matmul_sm_carveout(v1::SM_CARVEOUT_AUTO);
  } else if (word == "off") {
    s->set_matmul_sm_carveout(v1::SM_CARVEOUT_OFF);
  } else {
    if (!number || sms < 1 || sms > 64)
      return Invalid("matmul_sm_carveout: expected auto, off or a number of SMs from 1 to 64, got " + Show(node));
    s->set_matmul_sm_carveout(v1::SM_CARVEOUT_FIXED);
    s->set_matmul_sm_carveout_sms(static_cast<int32_t>(sms));
  }
  return absl::OkStatus();
}

// cuda_graphs: true, false, or auto (left unset: plan/job_spec.h's CudaGraphsFor).
Status ReadCudaGraphs(const YAML::Node& node, S* s) {
  std::string word;
  if (ReadScalar(node, &word) && word == "auto") {
    s->clear_cuda_graphs();
  } else if (node.IsScalar() && Resolve(node) == Scalar::kBool) {
    const std::string& v = node.Scalar();
    s->set_cuda_graphs(v == "true" || v == "True" || v == "TRUE");
  } else {
    return Invalid("cuda_graphs: expected auto, true or false, got " + Show(node));
  }
  return absl::OkStatus();
}

}  // namespace

// transport, nccl_ctas, nccl_headers and matmul_sm_carveout.
void AddLinkKeys(Table& add) {
  add("transport", kChoice,
      "how tensors travel between neighbouring stages: `auto` (NCCL where both ends of a link are CUDA devices of "
      "stage servers built with NCCL, else gRPC), `nccl` (every link; a link that cannot use NCCL fails the job "
      "with FAILED_PRECONDITION naming the link, never a silent fallback) or `grpc` (the chunked gRPC stream). "
      "`conveyor status` and the job summary name what each link used")
      .Choices(Names<v1::TransportKind>(
          {{"auto", v1::TRANSPORT_AUTO}, {"nccl", v1::TRANSPORT_NCCL}, {"grpc", v1::TRANSPORT_GRPC}}))
      .Expect("auto, nccl or grpc")
      .Default("auto")
      .Set([](const V& v, S* s) { s->set_transport(static_cast<v1::TransportKind>(v.integer)); });
  add("nccl_ctas", kInt,
      "thread blocks (so SMs) each NCCL communicator of a link may use, 1 to 64, or `0` for NCCL's own choice. A "
      "receive is posted as soon as its header arrives and waits on the device for its sender, spinning on its SMs "
      "meanwhile: few leave the SMs to the compute (see bench/RESULTS.md for what it costs and saves). With "
      "`cuda_graphs: true`, `0` means 2: NCCL's own count beside graph replays deadlocked W1's link on two H100s")
      .Default(std::to_string(kDefaultNcclCtas))
      .Range(0, 64)
      .Set([](const V& v, S* s) { s->set_nccl_ctas(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.nccl_ctas(); });
  add("nccl_headers", kChoice,
      "where an NCCL link's frame headers travel: `shm`, through a shared memory segment when both stages are on "
      "one host (containers: `ipc: host`), else on the link's gRPC stream; `grpc`, always on the stream. Shared "
      "memory took a 1 MB frame from 221 to 150 us and 64 MB frames from 291 to 322 GB/s on 2 H200s "
      "(bench/RESULTS.md)")
      .Choices(Names<v1::NcclHeaders>({{"shm", v1::NCCL_HEADERS_SHM}, {"grpc", v1::NCCL_HEADERS_GRPC}}))
      .Expect("shm or grpc")
      .Default("shm")
      .Set([](const V& v, S* s) { s->set_nccl_headers(static_cast<v1::NcclHeaders>(v.integer)); });
  add("matmul_sm_carveout", KeyType::kCustom,
      "SMs that matmuls (cuBLAS) leave free for the NCCL kernels running beside them: `off`, `auto` (`nccl_ctas` "
      "for each NCCL communicator of the stage, two per NCCL link) or a number from 1 to 64. A matmul sized for "
      "every SM can wait for the SMs a spinning receive holds. On W2 over 2 H200s `auto` changed nothing measurable "
      "(318.6 against 322.1 ms a step, its GEMMs' total time the same), hence off by default. Needs LibTorch 2.7 or "
      "later (LibTorch warns once that the setting is experimental; an older one logs that it is ignored)")
      .Expect("auto, off or a number of SMs from 1 to 64")
      .DefaultDoc("`off`")
      .Read(ReadCarveout);
}

// cuda_graphs, steps_in_flight, memory_format, cudnn_benchmark and profile_step.
void AddDeviceKeys(Table& add) {
  add("cuda_graphs", KeyType::kCustom,
      "CUDA devices record each chunk's forward and backward of each micro-batch as a pair of CUDA graphs during the "
      "second training step (the first runs as it is: kernel choices, lazy initialisation) and replay them from then "
      "on: one launch per pass instead of hundreds. Each pair keeps its own memory (its micro-batch's activations "
      "among it), so a stage holds every micro-batch's activations at once, as GPipe does, whatever the schedule. "
      "Inputs and gradients received are copied into the graphs' own tensors; parameter gradients are zeroed in "
      "place between steps. Training steps of another batch size, and evaluation, run as they are. Ignored on CPU "
      "stages; `true` is refused with `recompute`, mixed precision, loss scaling or the `zero-bubble` and `zbv` schedules "
      "(INVALID_ARGUMENT). `auto` (the default) is on for the zoo's models wherever graphs can work and hold no more "
      "memory than the schedule does: `conveyor train --reference`, one stage, one micro-batch, `gpipe`; off for "
      "`1f1b` and `interleaved` pipelines, replicas of a pipeline of several stages (replicas of one stage replay "
      "theirs and all-reduce the gradients after them), TorchScript models and the "
      "settings `true` refuses, and the job says once "
      "why (the reference's summary, the stage's log). Each stage's `graphed_steps` is in the status and the "
      "summary. On one H100 the Fashion-MNIST ConvNet's reference took 0.4 s an epoch with graphs against 1.4 s "
      "without (bench/RESULTS.md)")
      .Expect("auto, true or false")
      .DefaultDoc("`auto`")
      .Read(ReadCudaGraphs);
  add("steps_in_flight", kInt,
      "training steps the coordinator has sent to the stages at once: with `2` it sends step N+1 as soon as step N, "
      "so that a stage has its next request when a step ends, and a stage server launches N+1 while its device "
      "still works on N (the device does not wait for the host between steps) unless the stage has NCCL links or "
      "replicas that sum through Gloo (NCCL collectives are watched while the step's end is awaited), writes a checkpoint, is profiled, or has not yet recorded its CUDA graphs. Each reply still comes "
      "once the device has finished its step, so every figure and clock is that of finished steps. Steps whose "
      "update the coordinator decides (clipping over several stages, loss scaling) and an evaluation at an "
      "epoch's end run one at a time whatever this says, and so do the first steps under CUDA graphs, until every "
      "stage has recorded its graphs and replayed them once (W1 over an NCCL link hung when a step overlapped the "
      "recording one). `1`: one step at a time, each stage waiting for its device "
      "before it replies (W1 on one stage server on an H200: 15.7 ms a step with `2`, the reference's; see "
      "bench/RESULTS.md)")
      .Default("2")
      .Range(1, 2)
      .Set([](const V& v, S* s) { s->set_steps_in_flight(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return StepsInFlight(s); });
  add("memory_format", kChoice,
      "how 4-D tensors are laid out: `channels_last` converts the convolution weights once when a stage places them, "
      "the model's input once as it is loaded, and keeps activations and their gradients channels-last across "
      "stages (the frames say so; nothing is converted back and forth), as PyTorch's "
      "`model.to(memory_format=torch.channels_last)` does; `contiguous` keeps NCHW; `auto` is `channels_last` on "
      "CUDA devices for the zoo's convolutional models (resnet50, convnet: cuDNN's NHWC kernels and Tensor Cores) "
      "and `contiguous` elsewhere (LibTorch's CPU convolutions gain nothing). The arithmetic is the same up to "
      "float rounding")
      .Choices(Names<v1::MemoryFormat>({{"auto", v1::MEMORY_FORMAT_AUTO},
                                        {"contiguous", v1::MEMORY_FORMAT_CONTIGUOUS},
                                        {"channels_last", v1::MEMORY_FORMAT_CHANNELS_LAST}}))
      .Expect("auto, contiguous or channels_last")
      .Default("auto")
      .Set([](const V& v, S* s) { s->set_memory_format(static_cast<v1::MemoryFormat>(v.integer)); });
  add("cudnn_benchmark", kBool,
      "CUDA stages (and `conveyor train --reference` on CUDA) let cuDNN time its algorithms for each convolution "
      "shape on first use and keep the fastest (`torch.backends.cudnn.benchmark`). The first step of each micro-batch "
      "size is slower; later ones use the chosen kernels, whose rounding may differ from the default ones. Ignored "
      "on the CPU")
      .Default("true")
      .Set([](const V& v, S* s) { s->set_cudnn_benchmark(v.flag); });
  add("profile_step", kInt,
      "a training step (1-based) that every stage, and `conveyor train --reference`, runs under LibTorch's operator "
      "profiler, writing a Chrome trace (`<job>-step<N>-stage<K>.json`) to the stage server's `--profile-dir` "
      "(default its `--checkpoint-dir`; `conveyor local --profile-dir`, default the current folder). "
      "`bench/profile_summary.py A.json [B.json]` tabulates the costliest kernels and compares two runs, e.g. "
      "against `bench/torch_pipelining.py --profile-dir`")
      .DefaultDoc("none")
      .Range(0, 1e12)
      .Set([](const V& v, S* s) { s->set_profile_step(v.integer); })
      .Get([](const S& s) { return static_cast<double>(s.profile_step()); });
}

}  // namespace conveyor::job_keys_internal
