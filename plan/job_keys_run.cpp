// The job keys of how long a job runs (epochs or steps), its evaluation and
// seed, and the weights it starts from and writes.
#include "plan/job_key_rows.h"

namespace conveyor::job_keys_internal {

// epochs, steps, eval and seed; init_from and save.
void AddRunKeys(Table& add) {
  add("epochs", kInt, "passes over the training split (the last, incomplete batch of each is dropped) ...")
      .DefaultDoc("1")
      .Range(1, 100000)
      .Set([](const V& v, S* s) { s->set_epochs(static_cast<int32_t>(v.integer)); });
  add("steps", kInt, "... or a number of optimizer steps (not both)")
      .Range(1, 1e9)
      .Set([](const V& v, S* s) { s->set_steps(v.integer); });
  add("eval", kBool,
      "accuracy and mean loss (per token for token data; for gpt models and token data the summary and `--json` add its exp, the perplexity) on the whole test "
      "split: after every epoch for a job given in `epochs` (each epoch's mean loss, time and accuracy are in "
      "`conveyor status`, the summary and `--json`'s `epochs`), at the end for one given in `steps`")
      .Default("false")
      .Set([](const V& v, S* s) { s->set_eval(v.flag); });
  add("eval_batch_size", kInt, "samples per evaluation step")
      .Default("1000")
      .Range(1, 1e9)
      .Set([](const V& v, S* s) { s->set_eval_batch_size(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.eval_batch_size(); });
  add("seed", kInt,
      "weights, synthetic data and the shuffling all derive from it (a TorchScript model's weights come from its "
      "archive)")
      .Default("0")
      .Range(0)
      .Set([](const V& v, S* s) { s->set_seed(static_cast<uint64_t>(v.integer)); });

  // --- weights in and out
  add("init_from", kPath,
      "a state_dict (`torch.save(model.state_dict(), FILE)`) loaded by name before the first step, as "
      "`load_state_dict(strict=True)`: a missing, unexpected or mis-shaped key fails the job with "
      "`INVALID_ARGUMENT` naming the file and the key")
      .Set([](const V& v, S* s) { s->set_init_from(v.text); });
  add("save", kSection, "what is written when the job succeeds");
  add("save.path", kPath,
      "(required in `save`) when the job succeeds, the coordinator gathers every stage's parameters and buffers and "
      "writes them to this file (on its host, under a data root, atomically) as one state_dict that "
      "`torch.load(FILE, weights_only=True)` reads and `load_state_dict(..., strict=True)` takes; `conveyor train "
      "--reference` writes it too. Checked at submission: not a folder, the nearest folder of it that exists writable "
      "(missing ones are made when it is written), and no other queued or running job writing the same file "
      "(`FAILED_PRECONDITION` naming it). A write that fails after training fails the job but leaves the weights on "
      "the stage servers: `conveyor export JOB --out FILE` writes them")
      .Set([](const V& v, S* s) { s->set_save_path(v.text); });
  add("save.format", kChoice,
      "`state_dict`, or `torchscript`: the job's TorchScript archive with the trained weights, loadable by "
      "`torch.jit.load` (built by the first stage, written by the coordinator; a TorchScript model only)")
      .Choices(Names<v1::SaveFormat>({{"state_dict", v1::SAVE_FORMAT_STATE_DICT},
                                      {"torchscript", v1::SAVE_FORMAT_TORCHSCRIPT}}))
      .Expect("state_dict or torchscript")
      .DefaultDoc("`state_dict`")
      .Set([](const V& v, S* s) { s->set_save_format(static_cast<v1::SaveFormat>(v.integer)); });
}

}  // namespace conveyor::job_keys_internal
