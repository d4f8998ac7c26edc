// No hang and no change of result under timing noise: 100 in-process runs, each
// with a random schedule, stage count and micro-batch count, and every tensor
// delayed by a random time (so they arrive late and out of order). The seed is
// printed; CONVEYOR_NOISE_SEED replays a run.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <random>

#include "tests/support/in_process.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

// 12 layers: Flatten, 5 x (Linear, ReLU), Linear.
const char* kModel =
    "model: {name: mlp, input_dim: 6, hidden: [8, 8, 8, 8, 8], num_classes: 4}\n"
    "data: {name: synthetic, train_samples: 64}\nbatch_size: 16\nsteps: 3\n"
    "optimizer: {name: adam, lr: 0.01}\nseed: 9\nstage_timeout: 60\n";

TEST(TimingNoise, HundredRandomRunsFinishAndMatchTheReference) {
  at::set_num_threads(1);
  uint64_t seed = std::random_device{}();
  if (const char* env = std::getenv("CONVEYOR_NOISE_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::cout << "timing-noise seed " << seed << " (CONVEYOR_NOISE_SEED=" << seed << " replays it)" << std::endl;
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  const cli::ReferenceResult ref = testing::Reference(kModel);

  const char* schedules[] = {"gpipe", "1f1b", "interleaved", "zero-bubble"};
  for (int run = 0; run < 100; ++run) {
    const std::string schedule = schedules[rng() % 4];
    int stages = 1 + static_cast<int>(rng() % 4);
    int v = 1, m = 1 + static_cast<int>(rng() % 8);
    if (schedule == "interleaved") {
      v = 2 + static_cast<int>(rng() % 2);
      if (stages * v > 12) stages = 12 / v;
      m = stages * (1 + static_cast<int>(rng() % 2));
    }
    const int max_delay_us = static_cast<int>(rng() % 400);
    std::string yaml = std::string(kModel) + "schedule: " + schedule + "\npartition: {stages: " +
                       std::to_string(stages) + "}\nmicro_batches: " + std::to_string(m) + "\n";
    if (v > 1) yaml += "virtual_stages: " + std::to_string(v) + "\n";
    if (rng() % 4 == 0) yaml += "recompute: true\n";
    SCOPED_TRACE("run " + std::to_string(run) + ": " + schedule + ", " + std::to_string(stages) + " stages, " +
                 std::to_string(m) + " micro-batches, v=" + std::to_string(v) + ", delays up to " +
                 std::to_string(max_delay_us) + " us");
    std::mutex rng_mu;
    std::mt19937_64 delay_rng(rng());
    testing::InProcessCluster cluster(stages, [&] {
      std::lock_guard<std::mutex> lock(rng_mu);
      return std::chrono::microseconds(max_delay_us > 0 ? delay_rng() % max_delay_us : 0);
    });
    auto coordinator = cluster.StartCoordinator();
    v1::JobStatus status = testing::RunToEnd(*coordinator, yaml, 120);
    testing::ExpectMatchesReference(status, cluster.Parameters(status.job_id(), stages), ref);
    if (::testing::Test::HasFailure()) break;
  }
}

}  // namespace
}  // namespace conveyor
