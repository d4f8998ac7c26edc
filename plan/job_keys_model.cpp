// The job keys of the model, its precision and its partition: the rows of
// job_keys.cpp's table that say what is trained and how it is cut.
#include "plan/job_key_rows.h"

#include <algorithm>

#include "plan/model_catalog.h"

namespace conveyor::job_keys_internal {
namespace {

bool ZooModel(const S& s, v1::ModelKind kind) { return s.model().kind() == kind; }

}  // namespace

// name, and model: which model, from the zoo or from a file.
void AddModelSourceKeys(Table& add) {
  add("name", kName, "a label shown by `list` and `status`").Default("job").Set([](const V& v, S* s) {
    s->set_name(v.text);
  });

  add("model", kSection,
      "`{name: toy | mlp | convnet | resnet50 | gpt, ...}` or just the name; or `{torchscript: PATH}`, or "
      "`{exported: PATH}`")
      .Required()
      .Shorthand("name");
  add("model.name", kChoice, "a model of the zoo (see [Models](#models))")
      .Choices(Names<v1::ModelKind>({{"toy", v1::MODEL_TOY},
                                     {"mlp", v1::MODEL_MLP},
                                     {"convnet", v1::MODEL_CONVNET},
                                     {"resnet50", v1::MODEL_RESNET50},
                                     {"gpt", v1::MODEL_GPT}}))
      .Expect("a name")
      .Set([](const V& v, S* s) { s->mutable_model()->set_kind(static_cast<v1::ModelKind>(v.integer)); });
  add("model.torchscript", kPath,
      "your own model: a TorchScript archive of an `nn.Sequential` (`torch.jit.script(model).save(PATH)`), cut "
      "between its top-level children; its weights are the initial weights. Not with `name`. See "
      "[models.md](models.md)")
      .Set([](const V& v, S* s) {
        s->mutable_model()->set_kind(v1::MODEL_TORCHSCRIPT);
        s->mutable_model()->set_torchscript(v.text);
      });
  add("model.exported", kPath,
      "your own model from PyTorch 2: a program saved by `torch.export.save` (`.pt2`, training IR, from "
      "`torch.export.export(model, args)`), run through LibTorch's operator dispatcher; cut into layers at its "
      "`pipe_split()` marks and before each module of `cut_before`; its weights are the initial weights. Not with "
      "`name` or `torchscript`. See [models.md](models.md)")
      .Set([](const V& v, S* s) {
        s->mutable_model()->set_kind(v1::MODEL_EXPORTED);
        s->mutable_model()->set_exported(v.text);
      });
  add("model.cut_before", kName,
      "exported programs: module paths as the model names them (`fc`, `blocks.3`), separated by commas; a layer "
      "begins at the first operation of each")
      .Set([](const V& v, S* s) { s->mutable_model()->set_cut_before(v.text); });
}

// the zoo models' shapes, model.fused and precision.
void AddModelShapeKeys(Table& add) {
  auto model_int = [&](const char* key, const char* doc, void (v1::ModelSpec::*set)(int32_t),
                       int32_t (v1::ModelSpec::*get)() const) -> Row& {
    return add(std::string("model.") + key, kInt, doc)
        .Range(1, 1000000)
        .Set([set](const V& v, S* s) { (s->mutable_model()->*set)(static_cast<int32_t>(v.integer)); })
        .Get([get](const S& s) { return static_cast<double>((s.model().*get)()); });
  };
  model_int("num_classes", "width of the last layer", &v1::ModelSpec::set_num_classes, &v1::ModelSpec::num_classes)
      .DefaultDoc("5 (toy), 1000 (resnet50), 10")
      .Only("a zoo model", [](const S& s) { return !ModelFromFile(s.model()); });
  model_int("input_dim", "features per sample", &v1::ModelSpec::set_input_dim, &v1::ModelSpec::input_dim)
      .Range(1, 1e8)
      .DefaultDoc("784")
      .Only("name: mlp", [](const S& s) { return ZooModel(s, v1::MODEL_MLP); });
  add("model.hidden", KeyType::kIntList, "hidden widths (1 to 1000000 each)")
      .DefaultDoc("`[]`")
      .Only("name: mlp", [](const S& s) { return ZooModel(s, v1::MODEL_MLP); })
      .Set([](const V& v, S* s) {
        for (int64_t h : v.integers) s->mutable_model()->add_hidden(static_cast<int32_t>(h));
      });
  model_int("image_size", "inputs are 3 x size x size", &v1::ModelSpec::set_image_size, &v1::ModelSpec::image_size)
      .Range(32, 4096)
      .DefaultDoc("128")
      .Only("name: resnet50", [](const S& s) { return ZooModel(s, v1::MODEL_RESNET50); });
  const auto gpt = [](const S& s) { return ZooModel(s, v1::MODEL_GPT); };
  model_int("vocab", "token ids 0 to vocab - 1", &v1::ModelSpec::set_vocab, &v1::ModelSpec::vocab)
      .Range(1, 1e7)
      .DefaultDoc("32000")
      .Only("name: gpt", gpt);
  model_int("width", "model width (the defaults are W2's 1.34 B decoder)", &v1::ModelSpec::set_width,
            &v1::ModelSpec::width)
      .Range(1, 65536)
      .DefaultDoc("2048")
      .Only("name: gpt", gpt);
  model_int("blocks", "decoder blocks", &v1::ModelSpec::set_blocks, &v1::ModelSpec::blocks)
      .Range(1, 4096)
      .DefaultDoc("24")
      .Only("name: gpt", gpt);
  model_int("heads", "attention heads (they divide `width`)", &v1::ModelSpec::set_heads, &v1::ModelSpec::heads)
      .Range(1, 1024)
      .DefaultDoc("16")
      .Only("name: gpt", gpt);
  model_int("mlp_width", "the MLP's hidden width", &v1::ModelSpec::set_mlp_width, &v1::ModelSpec::mlp_width)
      .Range(1, 1 << 20)
      .DefaultDoc("4 x width")
      .Only("name: gpt", gpt);
  model_int("seq_len", "the longest sequence (learned positions)", &v1::ModelSpec::set_seq_len,
            &v1::ModelSpec::seq_len)
      .Range(1, 1 << 20)
      .DefaultDoc("1024")
      .Only("name: gpt", gpt);
  add("model.fused", kBool,
      "gpt, and exported programs that split attention's heads as `qkv.view(B, T, 3, heads, D).permute(2, 0, 3, 1, "
      "4).unbind(0)`: the gradients of q, k and v written once into the qkv projection's layout by a backward of "
      "Conveyor's own; false: what `qkv.unbind` does (a stack, then a copy). The same arithmetic either way")
      .Default("true")
      .Only("name: gpt or an exported program",
            [gpt](const S& s) { return gpt(s) || s.model().kind() == v1::MODEL_EXPORTED; })
      .Set([](const V& v, S* s) { s->mutable_model()->set_unfused_qkv(!v.flag); });
  add("precision", kChoice,
      "`fp32`; `bf16`: pure bfloat16, parameters, optimizer state and activations (the loss is computed in fp32); "
      "`bf16-mixed`: fp32 parameters and optimizer state (the master weights), forwards in bfloat16 under autocast "
      "as `torch.autocast` runs them, gradients in fp32 (see [Training recipes](#training-recipes)); `fp16-mixed` "
      "(CUDA stages only): the same in float16, with dynamic loss scaling (`loss_scale`)")
      .Choices(Names<v1::Precision>({{"fp32", v1::PRECISION_FP32},
                                     {"bf16", v1::PRECISION_BF16},
                                     {"bf16-mixed", v1::PRECISION_BF16_MIXED},
                                     {"fp16-mixed", v1::PRECISION_FP16_MIXED}}))
      .Expect("fp32, bf16, bf16-mixed or fp16-mixed")
      .Default("fp32")
      .Set([](const V& v, S* s) { s->set_precision(static_cast<v1::Precision>(v.integer)); });
}

// partition: how the model's layers are cut into stages.
void AddPartitionKeys(Table& add) {
  add("partition", kSection, "how the model's layers are cut into stages");
  add("partition.stages", kInt,
      "stages, cut into near-equal numbers of layers (resnet50 on 2 stages: the seed's cut between layer2 and layer3)")
      .Default("1")
      .DefaultDoc("1, or one more than the boundaries")
      .Range(1, 4096)
      .Set([](const V& v, S* s) { s->mutable_partition()->set_stages(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.partition().stages(); });
  add("partition.boundaries", KeyType::kIntList,
      "first layer index of stages 2..P (of chunks 2..P·v when interleaved); not with `balance`")
      .Set([](const V& v, S* s) {
        for (int64_t b : v.integers)
          s->mutable_partition()->add_boundaries(static_cast<int32_t>(std::clamp<int64_t>(b, -1, 1 << 30)));
      });
  add("partition.balance", kChoice,
      "without boundaries, how to cut: `layers` (near-equal counts), `params` (near-equal parameter counts) or "
      "`time` (near-equal forward + backward time of one micro-batch, profiled layer by layer on stage 0's device; "
      "the last layer's time includes the loss, which for a language model is as large as the vocabulary); the cut "
      "is the one whose step is shortest when the job's schedule is simulated with these costs (a third forward, "
      "two thirds backward, transfers free unless `link_gbps` gives the link; every cut is tried where there are at "
      "most 200,000, else coordinate descent from the cut with the most even chunks). With one chunk per stage that "
      "is about the cut with the cheapest costliest stage; interleaved, the first and last chunks come out lighter, "
      "as they lie on the warm-up's and cool-down's path")
      .Choices(Names<v1::Balance>(
          {{"layers", v1::BALANCE_LAYERS}, {"params", v1::BALANCE_PARAMS}, {"time", v1::BALANCE_TIME}}))
      .Expect("layers, params or time")
      .Default("layers")
      .Set([](const V& v, S* s) { s->mutable_partition()->set_balance(static_cast<v1::Balance>(v.integer)); });
  auto by_time = [](const S& s) { return s.partition().balance() == v1::BALANCE_TIME; };
  add("partition.link_gbps", kNumber,
      "the bandwidth between stage servers in Gb/s (hosts on 1, 10 or 25 Gb/s Ethernet): `balance: time` then "
      "costs each cut's transfers, one micro-batch's activations forward and their gradient back, each taking "
      "`link_latency_ms` + bytes / bandwidth on its link, one after the other, beside the compute; and prefers "
      "cuts where less crosses (the profile measures every layer's output). 0: transfers are free")
      .Default("0")
      .Range(0, 1e6)
      .Expect("a number of Gb/s")
      .Only("balance: time", by_time)
      .Set([](const V& v, S* s) { s->mutable_partition()->set_link_gbps(v.number); });
  add("partition.link_latency_ms", kNumber, "the link's latency for `link_gbps`, in milliseconds, each transfer")
      .Default("0")
      .Range(0, 1e6)
      .Expect("a number of milliseconds")
      .Only("balance: time", by_time)
      .Set([](const V& v, S* s) { s->mutable_partition()->set_link_latency_ms(v.number); });
}

}  // namespace conveyor::job_keys_internal
