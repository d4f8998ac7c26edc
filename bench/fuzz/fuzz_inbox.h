// What the fuzz targets' stage expects: stage 1 of 3 of job-1, activations of
// 3x4 samples into chunk 1 and gradients of 5 from it, at step 0.
#pragma once

#include "transport/inbox.h"

namespace conveyor::fuzz {

inline void OpenFuzzInbox(Inbox* inbox) {
  InboxExpectations expect;
  expect.job_id = "job-1";
  expect.stage_index = 1;
  expect.num_stages = 3;
  expect.activation_shapes[1] = {3, 4};
  expect.gradient_shapes[1] = {5};
  expect.max_micro_batches = 4;
  expect.max_micro_batch_size = 8;
  inbox->Open(expect);
  inbox->BeginStep(v1::PHASE_TRAIN, 0);
}

}  // namespace conveyor::fuzz
