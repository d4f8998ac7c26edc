// PyTorch is the oracle (issue 17): models defined, scripted and trained by
// Debian's python3-torch (tests/python/oracle.py), the same jobs trained by
// Conveyor over 1, 2 and 3 stage-server processes; per-step losses and the
// exported final weights must agree. Skips where no python3 can import torch.
//
// Under ctest, PyTorch's side of every case runs first, in one Python process
// (AgainstPyTorchOracle.TrainsEveryCaseInOneProcess, a fixture's setup):
// importing torch costs about 2 s of CPU, which each case once paid five times.
// A case run by itself, outside ctest, runs its own Python.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "cli/local_cluster.h"
#include "common/files.h"
#include "model/state_dict.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;

// The bar against PyTorch's own loop (fp32, CPU): issue 17's.
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;
// bf16-mixed against torch.autocast("cpu", torch.bfloat16), each layer called
// in turn as Conveyor calls them: the same kernels on the same values in the
// same order, so the two agree as closely as fp32 runs do (measured: 2.4e-7 on
// a loss, 0 on a parameter). The bar leaves room for one bf16 rounding that
// falls the other way (2^-8 = 3.9e-3 relative on one value, about 1e-4 on a
// mean loss) and stays well below what autocast changes: the same mlp job in
// fp32 and in bf16-mixed ends 1.1e-3 apart in its parameters (2.8e-4 in its
// loss), which this bar catches.
constexpr double kMixedRtol = 1e-3;
constexpr double kMixedAtol = 1e-4;

std::string Python() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    if (RunCommand({py, "-c", "import torch"}).exit_code == 0) return py;
  }
  return "";
}

std::string Oracle() { return std::string(CONVEYOR_SOURCE_DIR) + "/tests/python/oracle.py"; }

// A local cluster of `stages` stage servers whose one data root is `root`.
StatusOr<std::unique_ptr<cli::LocalCluster>> ClusterOver(const std::string& root, int stages) {
  cli::LocalClusterOptions options;
  options.remove_run_dir = true;
  options.stages = stages;
  options.bin_dir = CONVEYOR_BIN_DIR;
  options.data_roots = {root};
  return cli::LocalCluster::Start(options);
}

// The folder AgainstPyTorchOracle's setup fills and its cleanup removes, one
// a ctest run (ctest's TMPDIR is the run's): the cases' processes share it.
std::string SharedFolder() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/against-pytorch";
}

// The Python the fixture's setup ran, from the file it writes last; "" where
// it did not run.
std::string FixturePython() {
  std::ifstream ready(SharedFolder() + "/ready");
  std::string python;
  std::getline(ready, python);
  return python;
}

using Commands = std::vector<std::vector<std::string>>;

// oracle.py's commands that make each model (with its pretrained.pt where the
// bool says) in DIR/MODEL, and the scripted losses in DIR/losses.
Commands MakeCommands(const std::string& dir, const std::map<std::string, bool>& models) {
  Commands commands{{"losses", dir + "/losses"}};
  for (const auto& [model, pretrained] : models) {
    commands.push_back({"make", model, dir + "/" + model});
    if (pretrained) commands.push_back({"pretrained", dir + "/" + model});
  }
  return commands;
}

// `oracle.py batch`'s manifest, written to PATH; returns PATH.
std::string WriteManifest(const std::string& path, const Commands& commands) {
  std::ofstream(path) << nlohmann::json(commands).dump(1);
  return path;
}

struct Case {
  std::string model;  // oracle.py's: mlp, cnn-bn, frozen, tokens, decoder, decoder-ids, dropout, exported-cnn, exported-mlp, exported-dec, exported-dyn, exported-mask, exported-ids, exported-shared, exported-gpt, exported-heads
  int stages;
  int micro_batches;
  std::string schedule;
  bool init_from = false;
  std::string data = "tensors";  // the job's data format: tensors (train.pt) or tokens (train.bin)
  std::string loss = "cross_entropy";  // or "smoothed": loss: {torchscript: losses/smoothed.pt}
  bool recompute = false;        // every stage recomputes its forwards
  std::string recipe = "";       // Recipe(): optimizer, lr_schedule, clip_grad_norm ("": SGD with momentum)
  bool shards = false;           // data.train: the same samples in three shard files (a pattern)
};

// Issue 18's recipes: the job keys each one sets.
nlohmann::json Recipe(const std::string& name, int stages) {
  const nlohmann::json adamw = {{"name", "adamw"}, {"lr", 0.01},          {"betas", {0.9, 0.95}},
                                {"eps", 1e-8},     {"weight_decay", 0.1}, {"no_decay", {"bias"}}};
  if (name.empty()) return {{"optimizer", {{"name", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}}}};
  if (name == "nesterov")
    return {{"optimizer",
             {{"name", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.01}}}};
  if (name == "adam") return {{"optimizer", {{"name", "adam"}, {"lr", 0.01}, {"weight_decay", 0.01}}}};
  if (name == "adamw") return {{"optimizer", adamw}};
  if (name == "cosine")
    return {{"optimizer", adamw}, {"lr_schedule", {{"warmup_steps", 3}, {"decay", "cosine"}, {"min_lr", 0.001}}}};
  if (name == "linear")
    return {{"optimizer", {{"name", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}}},
            {"lr_schedule", {{"warmup_steps", 2}, {"decay", "linear"}, {"min_lr", 0.005}}}};
  if (name == "step")
    return {{"optimizer", {{"name", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}}},
            {"lr_schedule", {{"decay", "step"}, {"step_size", 3}, {"gamma", 0.5}}}};
  // The mlp's gradient norms are about 0.35 to 0.45: some steps are clipped, some not.
  if (name == "clip") return {{"optimizer", adamw}, {"clip_grad_norm", 0.38}};
  // 3 batches a step: 8 steps read 24 batches of 16 (4 epochs of 96 samples).
  if (name == "accumulate")
    return {{"optimizer", {{"name", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}}}, {"accumulate_steps", 3}};
  // fp32 master weights, forwards under CPU autocast in bf16.
  if (name == "bf16-mixed")
    return {{"optimizer", {{"name", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}}}, {"precision", "bf16-mixed"}};
  // Dynamic loss scaling on fp32 (exact: the scales are powers of two) with
  // an overflow injected at steps 2 (the last stage) and 3 (the first): both
  // skipped on every stage, the scale halved twice, grown back after 3
  // finite steps; with clipping and AdamW, whose step count skips too.
  if (name == "loss-scale")
    return {{"optimizer", adamw},
            {"clip_grad_norm", 0.38},
            {"loss_scale", {{"dynamic", true}, {"init", 1024.0}, {"growth_interval", 3}}},
            {"inject_inf_gradients", {{{"stage", stages - 1}, {"step", 2}}, {{"stage", 0}, {"step", 3}}}}};
  // All of it: AdamW without decay on biases, warmup then cosine, clipping, accumulation.
  return {{"optimizer", adamw},
          {"lr_schedule", {{"warmup_steps", 2}, {"decay", "cosine"}, {"min_lr", 0.001}}},
          {"clip_grad_norm", 0.3},
          {"accumulate_steps", 2}};
}

// How ctest names a case (its bytes otherwise).
void PrintTo(const Case& c, std::ostream* out) {
  *out << c.model << " over " << c.stages << " stages, " << c.micro_batches << " micro-batches, " << c.schedule
       << (c.init_from ? ", init_from" : "") << (c.loss != "cross_entropy" ? ", loss " + c.loss : "")
       << (c.recompute ? ", recompute" : "") << (c.recipe.empty() ? "" : ", " + c.recipe);
}

// The job's data block over the files `oracle.py make` wrote into MODEL/.
nlohmann::json DataBlock(const Case& c) {
  if (c.data == "tokens") {
    return {{"format", "tokens"}, {"train", c.model + "/train.bin"}, {"test", c.model + "/test.bin"},
            {"dtype", "uint16"},  {"seq_len", 8}};
  }
  return {{"format", "tensors"},
          {"train", c.model + (c.shards ? "/train-shard-*.pt" : "/train.pt")},
          {"test", c.model + "/test.pt"}};
}

// The job's model: a TorchScript archive, or a program from PyTorch 2.11
// (exported-*: the loop trains the module it came from, model.pt beside it).
nlohmann::json ModelBlock(const Case& c) {
  if (c.model == "exported-cnn") return {{"exported", c.model + "/cnn.pt2"}, {"cut_before", "bn, fc"}};
  if (c.model == "exported-mlp") return {{"exported", c.model + "/mlp.pt2"}};  // cut at its pipe_split() mark
  if (c.model == "exported-dec") return {{"exported", c.model + "/dec_pair.pt2"}};  // a pair at its mark
  if (c.model == "exported-dyn") return {{"exported", c.model + "/dec_dyn.pt2"}};  // its batch dynamic
  if (c.model == "exported-mask") return {{"exported", c.model + "/dec_mask.pt2"}};  // a mask crosses its mark
  if (c.model == "exported-ids") return {{"exported", c.model + "/dec_ids.pt2"}};    // int64 ids cross it
  if (c.model == "exported-shared") return {{"exported", c.model + "/dec_shared.pt2"}};  // a buffer both sides read
  if (c.model == "exported-gpt") return {{"exported", c.model + "/gpt_dyn.pt2"}};  // PyTorch 2.11's, batch dynamic
  if (c.model == "exported-heads") return {{"exported", c.model + "/dec_heads.pt2"}};  // heads split: one SplitHeads
  return {{"torchscript", c.model + "/model.pt"}};
}

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  std::string n = info.param.model + "_" + std::to_string(info.param.stages) + "stages_m" +
                  std::to_string(info.param.micro_batches) + "_" + info.param.schedule +
                  (info.param.init_from ? "_init_from" : "") +
                  (info.param.loss != "cross_entropy" ? "_" + info.param.loss : "") +
                  (info.param.recompute ? "_recompute" : "") + (info.param.recipe.empty() ? "" : "_" + info.param.recipe) +
                  (info.param.shards ? "_shards" : "");
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

class AgainstPyTorch : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    clusters_ = new std::map<int, std::unique_ptr<cli::LocalCluster>>();
    const std::string python = FixturePython();
    if (!python.empty()) {
      python_ = new std::string(python);
      dir_ = new std::string(SharedFolder());
      shared_ = true;
      return;
    }
    python_ = new std::string(Python());
    if (python_->empty()) return;
    dir_ = new std::string(testing::MakeTempDir("oracle"));
  }

  // The model's files, made by PyTorch on first use where no fixture made
  // them: a process then makes only what its cases need.
  static void MakeModel(const std::string& model, bool pretrained) {
    const std::string folder = *dir_ + "/" + model;
    if (std::ifstream(folder + "/model.pt").good() && (!pretrained || std::ifstream(folder + "/pretrained.pt").good()))
      return;
    auto r = RunCommand({*python_, Oracle(), "batch", WriteManifest(*dir_ + "/make-" + model + ".json",
                                                                    MakeCommands(*dir_, {{model, pretrained}}))});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete clusters_;
    clusters_ = nullptr;
    // The models, data and runs of every case (also outside ctest's TMPDIR);
    // the fixture's folder is its cleanup's.
    if (dir_ && !shared_) RemoveTree(*dir_);
    delete dir_;
    dir_ = nullptr;
  }

  // One cluster per stage count, its data root the fixtures' folder.
  static cli::LocalCluster* Cluster(int stages) {
    auto& c = (*clusters_)[stages];
    if (!c) {
      auto started = ClusterOver(*dir_, stages);
      EXPECT_TRUE(started.ok()) << started.status();
      if (started.ok()) c = std::move(*started);
    }
    return c.get();
  }

  static std::string* python_;
  static std::string* dir_;
  static bool shared_;  // dir_ is the fixture's: PyTorch's runs are there
  static std::map<int, std::unique_ptr<cli::LocalCluster>>* clusters_;
};

bool AgainstPyTorch::shared_ = false;
std::string* AgainstPyTorch::python_ = nullptr;
std::string* AgainstPyTorch::dir_ = nullptr;
std::map<int, std::unique_ptr<cli::LocalCluster>>* AgainstPyTorch::clusters_ = nullptr;

// The job, as JSON (which is YAML): PyTorch's loop reads the same file.
nlohmann::json OracleJob(const Case& c, const std::string& tag) {
  nlohmann::json job = {
      {"name", tag},
      {"model", ModelBlock(c)},
      {"data", DataBlock(c)},
      {"partition", {{"stages", c.stages}}},
      {"batch_size", 16},
      {"micro_batches", c.micro_batches},
      {"schedule", c.schedule},
      {"loss", c.loss == "cross_entropy" ? nlohmann::json(c.loss)
                                          : nlohmann::json{{"torchscript", "losses/" + c.loss + ".pt"}}},
      {"steps", 8},
      {"seed", 3},
      {"eval", true},
      {"eval_batch_size", 10},  // 32 test samples: three batches of 10 and one of 2
      {"save", {{"path", "out-" + tag + ".pt"}}}};
  job.update(Recipe(c.recipe, c.stages));
  if (c.init_from) job["init_from"] = c.model + "/pretrained.pt";
  if (c.recompute) job["recompute"] = true;
  return job;
}

struct Tolerance {
  double rtol, atol;
};

// The largest differences from PyTorch's run, printed and recorded.
struct Differences {
  double loss = 0, lr = 0, grad_norm = 0, eval_loss = 0, param = 0;
};

// Each step's loss, learning rate (LambdaLR's) and global gradient norm
// (clip_grad_norm_'s, before clipping).
void ExpectSteps(const v1::JobStatus& s, const nlohmann::json& oracle, Tolerance tol, Differences* d) {
  const auto& expected = oracle["losses"];
  ASSERT_EQ(s.losses_size(), static_cast<int>(expected.size()));
  for (int i = 0; i < s.losses_size(); ++i) {
    const double want = expected[static_cast<std::size_t>(i)];
    EXPECT_NEAR(s.losses(i), want, tol.atol + tol.rtol * std::abs(want)) << "step " << i + 1;
    d->loss = std::max(d->loss, std::abs(s.losses(i) - want));
  }
  ASSERT_EQ(s.lrs_size(), s.losses_size());
  ASSERT_EQ(s.grad_norms_size(), s.losses_size());
  for (int i = 0; i < s.losses_size(); ++i) {
    const double lr = oracle["lrs"][static_cast<std::size_t>(i)];
    const auto& oracle_norm = oracle["grad_norms"][static_cast<std::size_t>(i)];
    if (oracle_norm.is_null()) {  // not finite: a step skipped under loss scaling
      EXPECT_FALSE(std::isfinite(s.grad_norms(i))) << "gradient norm of step " << i + 1 << ": PyTorch's is not finite";
      continue;
    }
    const double norm = oracle_norm;
    EXPECT_NEAR(s.lrs(i), lr, 1e-12 + 1e-9 * lr) << "lr of step " << i + 1;
    EXPECT_NEAR(s.grad_norms(i), norm, tol.atol + tol.rtol * norm) << "gradient norm of step " << i + 1;
    d->lr = std::max(d->lr, std::abs(s.lrs(i) - lr));
    d->grad_norm = std::max(d->grad_norm, std::abs(s.grad_norms(i) - norm));
  }
}

// Loss scaling: the same scale at every step as GradScaler's rule.
void ExpectLossScales(const v1::JobStatus& s, const nlohmann::json& oracle, const std::string& recipe) {
  const auto want_scales = oracle.value("loss_scales", nlohmann::json::array());
  ASSERT_EQ(s.loss_scales_size(), static_cast<int>(want_scales.size()));
  for (int i = 0; i < s.loss_scales_size(); ++i)
    EXPECT_EQ(s.loss_scales(i), double(want_scales[static_cast<std::size_t>(i)])) << "loss scale of step " << i + 1;
  if (recipe == "loss-scale") {  // the rule itself, not only agreement: halved twice, then grown back
    EXPECT_EQ(std::vector<double>(s.loss_scales().begin(), s.loss_scales().end()),
              (std::vector<double>{1024, 1024, 1024, 512, 256, 256, 256, 512}));
    EXPECT_FALSE(std::isfinite(s.grad_norms(2)));
    EXPECT_FALSE(std::isfinite(s.grad_norms(3)));
  }
}

// The test split evaluated as PyTorch evaluates it: mean loss (per token for
// token data, whose perplexity is its exp) and accuracy.
void ExpectEval(const v1::JobStatus& s, const nlohmann::json& oracle, Tolerance tol, Differences* d) {
  ASSERT_TRUE(s.has_eval());
  const double eval_loss = oracle["eval_loss"], eval_accuracy = oracle["eval_accuracy"];
  EXPECT_NEAR(s.eval_loss(), eval_loss, tol.atol + tol.rtol * std::abs(eval_loss));
  EXPECT_NEAR(std::exp(s.eval_loss()), double(oracle["eval_perplexity"]),
              tol.atol + tol.rtol * double(oracle["eval_perplexity"]));
  EXPECT_DOUBLE_EQ(s.eval_accuracy(), eval_accuracy);  // the same predictions, counted alike
  d->eval_loss = std::abs(s.eval_loss() - eval_loss);
}

// The weights Conveyor exported against those PyTorch trained, by name.
void ExpectWeights(const std::string& got_path, const std::string& want_path, Tolerance tol, Differences* d) {
  auto got = ReadStateDict(got_path);
  ASSERT_TRUE(got.ok()) << got.status();
  auto want = ReadStateDict(want_path);
  ASSERT_TRUE(want.ok()) << want.status();
  std::map<std::string, at::Tensor> by_name(want->begin(), want->end());
  ASSERT_EQ(got->size(), want->size());
  for (const auto& [name, t] : *got) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    const at::Tensor& w = by_name[name];
    ASSERT_EQ(t.sizes(), w.sizes()) << name;
    EXPECT_TRUE(at::allclose(t.to(at::kDouble), w.to(at::kDouble), tol.rtol, tol.atol)) << name;
    if (t.numel() > 0) d->param = std::max(d->param, (t.to(at::kDouble) - w.to(at::kDouble)).abs().max().item<double>());
  }
}

TEST_P(AgainstPyTorch, LossesAndWeightsEqualPyTorchsOwnLoop) {
  if (python_->empty()) GTEST_SKIP() << "no python3 that imports torch (Debian's python3-torch)";
  const Case& c = GetParam();
  MakeModel(c.model, c.init_from);
  if (HasFatalFailure()) return;
  const std::string tag = Name(::testing::TestParamInfo<Case>(c, 0));
  const nlohmann::json job = OracleJob(c, tag);
  const std::string job_path = *dir_ + "/" + tag + ".json";
  // PyTorch reads the paths relative to the job's folder; so does Conveyor,
  // whose first data root is that folder.
  const std::string ref = *dir_ + "/ref-" + tag + ".json";
  // The fixture's run of this job stands where its file is this job.
  const auto written = ReadWholeFile(job_path);
  if (!shared_ || !written.ok() || *written != job.dump(1) || !std::ifstream(ref).good()) {
    std::ofstream(job_path) << job.dump(1);
    auto r = RunCommand({*python_, Oracle(), "train", job_path, ref});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const auto oracle = nlohmann::json::parse(std::ifstream(ref));

  cli::LocalCluster* cluster = Cluster(c.stages);
  ASSERT_NE(cluster, nullptr);
  std::ifstream in(job_path);
  const std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  v1::JobStatus s = testing::SubmitAndWait(cluster->coordinator_address(), yaml);
  ASSERT_EQ(s.state(), v1::JOB_STATE_SUCCEEDED) << s.error();
  const bool mixed = job.value("precision", "fp32") == "bf16-mixed";
  const Tolerance tol = mixed ? Tolerance{kMixedRtol, kMixedAtol} : Tolerance{kRtol, kAtol};
  Differences d;
  ExpectSteps(s, oracle, tol, &d);
  if (HasFatalFailure()) return;
  ExpectLossScales(s, oracle, c.recipe);
  if (HasFatalFailure()) return;
  ExpectEval(s, oracle, tol, &d);
  if (HasFatalFailure()) return;
  const std::string out = *dir_ + "/out-" + tag + ".pt";
  ExpectWeights(out, ref.substr(0, ref.size() - 5) + ".pt", tol, &d);
  if (HasFatalFailure()) return;
  // Python reads the export with weights_only=True (the fixture's cleanup
  // reads every case's at once).
  if (!shared_) {
    auto r = RunCommand({*python_, Oracle(), "load", out});
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  RecordProperty("max_loss_diff", std::to_string(d.loss));
  RecordProperty("max_param_diff", std::to_string(d.param));
  RecordProperty("eval_loss_diff", std::to_string(d.eval_loss));
  RecordProperty("max_grad_norm_diff", std::to_string(d.grad_norm));
  std::cout << tag << ": largest difference from PyTorch: loss " << d.loss << ", parameter " << d.param << ", lr "
            << d.lr << ", gradient norm " << d.grad_norm << ", test loss " << d.eval_loss << " (accuracy "
            << s.eval_accuracy() << ")" << std::endl;
}

std::vector<Case> ModelCases() {
  return {Case{"mlp", 1, 1, "gpipe"}, Case{"mlp", 2, 4, "1f1b"}, Case{"mlp", 3, 4, "gpipe"},
                      Case{"mlp", 2, 4, "1f1b", /*init_from=*/true}, Case{"cnn-bn", 1, 4, "gpipe"},
                      Case{"cnn-bn", 2, 4, "1f1b"}, Case{"cnn-bn", 3, 2, "gpipe"}, Case{"frozen", 2, 4, "1f1b"},
                      Case{"frozen", 3, 4, "zero-bubble"}, Case{"tokens", 1, 2, "gpipe", false, "tokens"},
                      Case{"tokens", 2, 4, "1f1b", false, "tokens"},
                      // (hidden, bool mask) crosses every boundary; token ids in.
                      Case{"decoder", 1, 2, "gpipe"}, Case{"decoder", 2, 4, "1f1b"}, Case{"decoder", 3, 3, "gpipe"},
                      Case{"decoder", 3, 4, "zero-bubble"},
                      Case{"decoder", 2, 2, "1f1b", false, "tensors", "cross_entropy", /*recompute=*/true},
                      // (hidden, int64 ids) crosses: the ids get no gradient.
                      Case{"decoder-ids", 2, 4, "1f1b"}, Case{"decoder-ids", 3, 2, "gpipe"},
                      // Dropout seeded by (seed, step, micro-batch, layer): any cut, and recomputed.
                      Case{"dropout", 1, 4, "gpipe"}, Case{"dropout", 2, 4, "1f1b"},
                      Case{"dropout", 2, 2, "gpipe", false, "tensors", "cross_entropy", /*recompute=*/true},
                      Case{"mlp", 2, 4, "1f1b", false, "tensors", "smoothed"},
                      Case{"tokens", 2, 2, "gpipe", false, "tokens", "smoothed"},
                      // data.train: train-shard-*.pt, the same samples in three files.
                      Case{"mlp", 2, 4, "1f1b", false, "tensors", "cross_entropy", false, "", /*shards=*/true},
                      Case{"cnn-bn", 1, 4, "gpipe", false, "tensors", "cross_entropy", false, "", /*shards=*/true},
                      // A torch.export program (issue 35): conv | BatchNorm, ReLU, pool, dropout | linear.
                      Case{"exported-cnn", 1, 4, "gpipe"}, Case{"exported-cnn", 2, 4, "1f1b"},
                      Case{"exported-cnn", 3, 2, "gpipe"},
                      Case{"exported-cnn", 3, 4, "zero-bubble"},
                      // BatchNorm's running statistics updated once per micro-batch, not again when recomputed.
                      Case{"exported-cnn", 2, 2, "1f1b", false, "tensors", "cross_entropy", /*recompute=*/true},
                      Case{"cnn-bn", 2, 4, "1f1b", false, "tensors", "cross_entropy", /*recompute=*/true},
                      Case{"exported-cnn", 2, 2, "gpipe", false, "tensors", "cross_entropy", false, "adamw"},
                      Case{"exported-cnn", 2, 4, "1f1b", /*init_from=*/true},
                      // A program cut by the pipe_split() mark PyTorch 2.11 exported in it.
                      Case{"exported-mlp", 2, 4, "1f1b"},
                      // A decoder whose mark cuts the pair (hidden, positions), on token data.
                      Case{"exported-dec", 1, 2, "gpipe", false, "tokens"},
                      Case{"exported-dec", 2, 4, "1f1b", false, "tokens"},
                      Case{"exported-dec", 2, 2, "gpipe", false, "tokens", "cross_entropy", false, "adamw"},
                      // Micro-batches of 8 and evaluation batches of 10 and 2: not the example's 4.
                      Case{"exported-dyn", 2, 2, "1f1b", false, "tokens"},
                      // A mask without the batch sliced from a buffer before the mark, read after it.
                      Case{"exported-mask", 2, 4, "1f1b", false, "tokens"},
                      // The token ids (int64, no gradient) cross the mark beside the pair.
                      Case{"exported-ids", 2, 4, "1f1b", false, "tokens"},
                      // A mask buffer read on both sides of the mark: a copy after it.
                      Case{"exported-shared", 2, 2, "gpipe", false, "tokens"},
                      // Attention's heads split from the projection by view, permute and unbind, which the
                      // stages run as one split with a backward of their own: as PyTorch's autograd.
                      Case{"exported-heads", 2, 2, "1f1b", false, "tokens"},
                      // nanoGPT's decoder exported by PyTorch 2.11 with the batch dynamic (at 4): its sizes
                      // in sympy's srepr form, `B, T, C = x.size()` on both sides of the mark, micro-batches of 8.
                      Case{"exported-gpt", 2, 2, "1f1b", false, "tokens"}};
}
INSTANTIATE_TEST_SUITE_P(Models, AgainstPyTorch, ::testing::ValuesIn(ModelCases()), Name);

// Issue 18: optimizers with parameter groups, schedules and clipping by the
// global norm, step by step against torch.optim, LambdaLR and clip_grad_norm_.
std::vector<Case> RecipeCases() {
  return {Case{"mlp", 2, 2, "1f1b", false, "tensors", "cross_entropy", false, "nesterov"},
                      Case{"mlp", 2, 2, "1f1b", false, "tensors", "cross_entropy", false, "adam"},
                      Case{"cnn-bn", 2, 2, "gpipe", false, "tensors", "cross_entropy", false, "adamw"},
                      Case{"mlp", 1, 2, "gpipe", false, "tensors", "cross_entropy", false, "cosine"},
                      Case{"mlp", 2, 2, "gpipe", false, "tensors", "cross_entropy", false, "linear"},
                      Case{"mlp", 2, 2, "gpipe", false, "tensors", "cross_entropy", false, "step"},
                      Case{"mlp", 1, 2, "gpipe", false, "tensors", "cross_entropy", false, "clip"},
                      Case{"mlp", 3, 4, "1f1b", false, "tensors", "cross_entropy", false, "clip"},
                      Case{"mlp", 1, 2, "gpipe", false, "tensors", "cross_entropy", false, "accumulate"},
                      Case{"cnn-bn", 2, 2, "1f1b", false, "tensors", "cross_entropy", false, "accumulate"},
                      Case{"frozen", 3, 4, "zero-bubble", false, "tensors", "cross_entropy", false, "recipe"},
                      Case{"mlp", 2, 4, "1f1b", false, "tensors", "cross_entropy", false, "bf16-mixed"},
                      Case{"cnn-bn", 2, 2, "gpipe", false, "tensors", "cross_entropy", false, "bf16-mixed"},
                      Case{"exported-cnn", 2, 2, "gpipe", false, "tensors", "cross_entropy", false, "bf16-mixed"},
                      Case{"tokens", 2, 4, "1f1b", false, "tokens", "cross_entropy", false, "bf16-mixed"},
                      Case{"tokens", 2, 4, "1f1b", false, "tokens", "cross_entropy", false, "recipe"},
                      Case{"mlp", 1, 2, "gpipe", false, "tensors", "cross_entropy", false, "loss-scale"},
                      // (Not cnn-bn: its conv biases feed BatchNorm, their true gradient is 0, and AdamW
                      // turns the rounding noise of a different summation order into steps of lr.)
                      Case{"mlp", 3, 4, "1f1b", false, "tensors", "cross_entropy", false, "loss-scale"}};
}
INSTANTIATE_TEST_SUITE_P(Recipes, AgainstPyTorch, ::testing::ValuesIn(RecipeCases()), Name);

// The fixture's setup (ctest runs it before any case): every model, and
// PyTorch's run of every case's job, made in one Python process.
TEST(AgainstPyTorchOracle, TrainsEveryCaseInOneProcess) {
  const std::string python = Python();
  if (python.empty()) GTEST_SKIP() << "no python3 that imports torch (Debian's python3-torch)";
  const std::string dir = SharedFolder();
  RemoveTree(dir);
  ASSERT_TRUE(MakeDirs(dir).ok()) << dir;
  std::vector<Case> cases = ModelCases();
  for (const Case& c : RecipeCases()) cases.push_back(c);
  std::map<std::string, bool> models;
  for (const Case& c : cases) models[c.model] = models[c.model] || c.init_from;
  Commands commands = MakeCommands(dir, models);
  for (const Case& c : cases) {
    const std::string tag = Name(::testing::TestParamInfo<Case>(c, 0));
    std::ofstream(dir + "/" + tag + ".json") << OracleJob(c, tag).dump(1);
    commands.push_back({"train", dir + "/" + tag + ".json", dir + "/ref-" + tag + ".json"});
  }
  const auto r = RunCommand({python, Oracle(), "batch", WriteManifest(dir + "/manifest.json", commands)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ofstream(dir + "/ready") << python << "\n";
}

// The fixture's cleanup (after every case): Python reads each case's exported
// weights with weights_only=True, then the folder goes.
TEST(AgainstPyTorchOracle, PythonLoadsEveryExportWithWeightsOnly) {
  const std::string dir = SharedFolder();
  const std::string python = FixturePython();
  if (python.empty()) GTEST_SKIP() << "no " << dir << "/ready: the fixture's setup did not run";
  std::vector<std::string> load{python, Oracle(), "load"};
  for (const std::string& name : ListDir(dir))
    if (name.rfind("out-", 0) == 0) load.push_back(dir + "/" + name);
  if (load.size() > 3) {
    const auto r = RunCommand(load);
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  RemoveTree(dir);
  if (load.size() == 3) GTEST_SKIP() << "no case wrote its weights";
}

// An exported program in pure bf16 (parameters, optimizer state and
// activations; the loss in fp32) over two stage servers trains as the
// single-process bf16 reference does: bf16 keeps 8 bits of mantissa, so the
// same training within 0.05 a step, not the same bits.
TEST(ExportedJobs, Bf16OverTwoStagesTrainsAsTheBf16Reference) {
  const std::string python = Python();
  if (python.empty()) GTEST_SKIP() << "no python3 that imports torch (Debian's python3-torch)";
  const std::string dir = testing::MakeTempDir("exported-bf16");
  ASSERT_EQ(RunCommand({python, Oracle(), "make", "exported-mlp", dir}).exit_code, 0);
  const std::string job = "data: {format: tensors, train: train.pt}\nbatch_size: 16\nmicro_batches: 4\nsteps: 8\n"
                          "optimizer: {name: adamw, lr: 0.01}\nprecision: bf16\n";
  auto cluster = ClusterOver(dir, 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const v1::JobStatus run = testing::SubmitAndWait((*cluster)->coordinator_address(),
                                                   "model: {exported: mlp.pt2}\npartition: {stages: 2}\n" + job);
  ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  const std::string absolute = "model: {exported: " + dir + "/mlp.pt2}\n" + job;
  const cli::ReferenceResult ref = testing::Reference(std::regex_replace(absolute, std::regex("train: "), "train: " + dir + "/"));
  ASSERT_EQ(run.losses_size(), ref.status.losses_size());
  for (int i = 0; i < run.losses_size(); ++i) EXPECT_NEAR(run.losses(i), ref.status.losses(i), 0.05) << "step " << i + 1;
  EXPECT_LT(run.losses(run.losses_size() - 1), run.losses(0));
  EXPECT_EQ(run.stages(1).layer_begin(), 1);  // cut at the program's pipe_split() mark
  EXPECT_EQ(run.stages(0).parameter_bytes(), (16 * 32 + 32) * 2) << "l1's weight and bias in bf16";
  cluster->reset();
  RemoveTree(dir);
}

// A job the servers must fail, with its gRPC code and the words its error carries.
struct BadFileCase {
  std::string yaml;
  const char* code;
  const char* says;
};

// Data, one row a bad file: the TorchScript and exported models, data, init_from
// and loss files of tests/python/oracle.py's "bad" folder; `good` is a job that
// trains, each row changes one thing of it.
std::vector<BadFileCase> BadFileCases(const std::string& good) {
  const std::string data = "data: {format: tensors, train: mlp/train.pt}\n";
  const std::string exported = data + "partition: {stages: 2}\n";
  return {
      {"model: {torchscript: bad/notscript.pt}\n" + exported, "INVALID_ARGUMENT",
       "bad/notscript.pt is not a TorchScript archive"},
      {"model: {torchscript: bad/notscript.pt}\n" + exported, "INVALID_ARGUMENT",
       "save the model with torch.jit.script(model).save(PATH)"},
      {"model: {torchscript: bad/module.pt}\n" + data, "INVALID_ARGUMENT", "not an nn.Sequential"},
      {"model: {torchscript: mlp/model.pt}\n" + data + "partition: {boundaries: [9]}\n", "INVALID_ARGUMENT",
       "6 layers"},
      {"model: {torchscript: mlp/model.pt}\ndata: {format: tensors, train: bad/uneven.pt}\n", "INVALID_ARGUMENT",
       "has 10 inputs and 9 targets"},
      {good + "init_from: bad/wide.pt\n", "INVALID_ARGUMENT", "'1.weight' is [33, 64]"},
      {good + "init_from: bad/extra.pt\n", "INVALID_ARGUMENT", "'9.weight', which is no parameter or buffer"},
      {good + "init_from: mlp/train.pt\n", "INVALID_ARGUMENT", "init_from"},
      // Exported programs: a file that is none, a module the program does not have.
      {"model: {exported: bad/notscript.pt}\n" + exported, "INVALID_ARGUMENT",
       "not a program saved by torch.export.save"},
      {"model: {exported: cnn.pt2, cut_before: head}\n" + exported, "INVALID_ARGUMENT",
       "cut_before: no module 'head' in the program"},
      // A decoder whose two blocks both add its positions, cut between them.
      {"model: {exported: dec_math.pt2}\n" + exported, "INVALID_ARGUMENT",
       "'pos' is used by layers 0 to 1, and a stage holds layers [0, 1): a parameter tied across a stage boundary"},
      {good + "loss: {torchscript: bad/notscript.pt}\n", "INVALID_ARGUMENT",
       "/bad/notscript.pt is not a TorchScript archive"},
      {good + "loss: {torchscript: losses/per_sample.pt}\n", "INVALID_ARGUMENT", "returns a tensor of shape [2]"},
      // A NaN in sample 37 (file order: the third batch of 16) makes the loss
      // NaN at step 3: the job fails there, loudly, and makes no update with it.
      {"model: {torchscript: mlp/model.pt}\ndata: {format: tensors, train: bad/nan.pt, shuffle: false}\n"
       "batch_size: 16\npartition: {stages: 2}\nsteps: 5\noptimizer: adamw\nclip_grad_norm: 1.0\n",
       "FAILED_PRECONDITION", "step 3: the loss is nan on stage 1 (the last); no update was made"},
  };
}

// `conveyor ARGS... FILE`, FILE holding `yaml`: exits 1 with each of `says`.
void ExpectCommandRefuses(std::vector<std::string> args, const std::string& file, const std::string& yaml,
                          const std::vector<std::string>& says) {
  std::ofstream(file) << yaml;
  args.insert(args.begin(), testing::Binary("conveyor"));
  args.push_back(file);
  auto r = RunCommand(args);
  EXPECT_EQ(r.exit_code, 1) << yaml;
  for (const std::string& words : says) EXPECT_THAT(r.err, HasSubstr(words)) << yaml;
}

// Files a job must refuse, each with a named error, the servers serving on.
TEST(TorchScriptJobs, BadFilesAreNamed) {
  const std::string python = Python();
  if (python.empty()) GTEST_SKIP() << "no python3 that imports torch (Debian's python3-torch)";
  const std::string dir = testing::MakeTempDir("oracle-bad");
  const Commands make{{"make", "mlp", dir + "/mlp"}, {"bad", dir + "/bad"}, {"losses", dir + "/losses"}};
  const auto made = RunCommand({python, Oracle(), "batch", WriteManifest(dir + "/make.json", make)});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  for (const char* pt2 : {"cnn.pt2", "dec_math.pt2"})
    std::filesystem::copy_file(std::string(CONVEYOR_SOURCE_DIR) + "/tests/fixtures/pt2/" + pt2, dir + "/" + pt2);
  auto cluster = ClusterOver(dir, 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string coord = (*cluster)->coordinator_address();
  const std::string good =
      "model: {torchscript: mlp/model.pt}\ndata: {format: tensors, train: mlp/train.pt}\nbatch_size: 8\n"
      "partition: {stages: 2}\nsteps: 2\n";
  for (const BadFileCase& c : BadFileCases(good)) {
    v1::JobStatus s = testing::SubmitAndWait(coord, c.yaml);
    EXPECT_EQ(s.state(), v1::JOB_STATE_FAILED) << c.yaml;
    EXPECT_EQ(s.error_code(), c.code) << s.error();
    EXPECT_THAT(s.error(), HasSubstr(c.says)) << c.yaml;
  }
  // The reference finds the per-sample loss at its first step, and the NaN at step 3.
  ExpectCommandRefuses({"train", "--reference"}, dir + "/per-sample.yaml",
                       good + "loss: {torchscript: losses/per_sample.pt}\n",
                       {"per_sample.pt returns a tensor of shape [8]", "(INVALID_ARGUMENT)"});
  ExpectCommandRefuses({"train", "--reference"}, dir + "/nan.yaml",
                       "model: {torchscript: mlp/model.pt}\ndata: {format: tensors, train: bad/nan.pt, shuffle: false}\n"
                       "batch_size: 16\nsteps: 5\n",
                       {"step 3: the loss is not finite; no update was made (FAILED_PRECONDITION)"});
  // Refused when the job is submitted: a path outside the data roots, and a
  // token file that is no whole number of token ids.
  ExpectCommandRefuses({"--coordinator", coord, "submit"}, dir + "/outside.yaml",
                       "model: {torchscript: /etc/hostname}\n",
                       {"model.torchscript: /etc/hostname", "is outside the data roots", "PERMISSION_DENIED"});
  ExpectCommandRefuses({"--coordinator", coord, "submit"}, dir + "/odd-tokens.yaml",
                       "model: {torchscript: mlp/model.pt}\n"
                       "data: {format: tokens, train: bad/odd.bin, dtype: uint16, seq_len: 4}\n",
                       {"data.train: ", "/bad/odd.bin is 47 bytes, not a whole number of uint16 token ids",
                        "INVALID_ARGUMENT"});
  // The cluster still trains.
  EXPECT_EQ(testing::SubmitAndWait(coord, good).state(), v1::JOB_STATE_SUCCEEDED);
  cluster->reset();
  RemoveTree(dir);
}

}  // namespace
}  // namespace conveyor
