#include "stage_server/split_backward.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace conveyor {

using torch::autograd::Edge;
using torch::autograd::Node;

// A node where the input gradients' path meets parameters: the gradients that
// reached it in the input pass, and the parameters' edges it leads to.
struct SplitBackward::Boundary {
  std::shared_ptr<Node> node;  // null for a root outside the inputs' path
  std::vector<Edge> roots;     // a root's own edges
  std::vector<at::Tensor> grads;
  std::vector<Edge> params;
  std::atomic<bool> capturing{true};
};

namespace {

class Capture : public torch::autograd::FunctionPreHook {
 public:
  explicit Capture(std::weak_ptr<SplitBackward::Boundary> into) : into_(std::move(into)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (auto b = into_.lock(); b && b->capturing.load()) b->grads = grads;
    return grads;
  }

 private:
  std::weak_ptr<SplitBackward::Boundary> into_;
};

// The graph from the roots: which nodes lead to one of `targets` (post-order,
// iteratively: a decoder's graph is thousands of nodes deep).
std::unordered_map<Node*, bool> LeadsTo(const std::vector<Edge>& roots, const std::unordered_set<Node*>& targets) {
  std::unordered_map<Node*, bool> leads;
  std::vector<std::pair<Node*, std::size_t>> stack;
  for (const Edge& r : roots) {
    if (!r.function || leads.count(r.function.get())) continue;
    leads[r.function.get()] = false;
    stack.emplace_back(r.function.get(), 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->num_outputs()) {
        const Edge& e = node->next_edge(next++);
        Node* child = e.function.get();
        if (child && !leads.count(child)) {
          leads[child] = false;
          stack.emplace_back(child, 0);
        }
        continue;
      }
      bool any = targets.count(node) > 0;
      for (const Edge& e : node->next_edges())
        if (e.function && leads[e.function.get()]) any = true;
      leads[node] = any;
      stack.pop_back();
    }
  }
  return leads;
}

// The parameter nodes reachable from `from` through nodes off the inputs' path.
void ParamsOffPath(Node* from, const std::unordered_map<Node*, bool>& on_path,
                   const std::unordered_set<Node*>& param_nodes, std::unordered_set<Node*>* seen,
                   std::vector<Node*>* found) {
  std::vector<Node*> stack{from};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (!seen->insert(n).second) continue;
    if (param_nodes.count(n)) {
      found->push_back(n);
      continue;
    }
    for (const Edge& e : n->next_edges()) {
      Node* c = e.function.get();
      if (c && !on_path.at(c)) stack.push_back(c);
    }
  }
}

}  // namespace

SplitBackward::~SplitBackward() = default;

std::vector<at::Tensor> SplitBackward::InputPass(const std::vector<at::Tensor>& roots,
                                                 const std::vector<at::Tensor>& root_grads,
                                                 const std::vector<at::Tensor>& inputs,
                                                 const std::vector<at::Tensor>& params,
                                                 std::shared_ptr<SplitBackward>* weights) {
  auto self = std::shared_ptr<SplitBackward>(new SplitBackward());
  self->roots_ = roots;
  self->root_grads_ = root_grads;
  self->params_ = params;

  std::vector<Edge> root_edges;
  for (const at::Tensor& r : roots) root_edges.push_back(torch::autograd::impl::gradient_edge(r));
  std::unordered_set<Node*> input_nodes, param_nodes;
  for (const at::Tensor& x : inputs) input_nodes.insert(torch::autograd::impl::gradient_edge(x).function.get());
  std::unordered_map<Node*, Edge> param_edge;
  for (const at::Tensor& p : params) {
    Edge e = torch::autograd::impl::gradient_edge(p);
    param_nodes.insert(e.function.get());
    param_edge.emplace(e.function.get(), e);
  }
  const std::unordered_map<Node*, bool> on_path = LeadsTo(root_edges, input_nodes);

  // Boundaries: on the path, with an edge off it; roots off the path start
  // their own. Each parameter must be reached from one only.
  std::unordered_map<Node*, int> owners;
  bool shared = false;
  auto add = [&](std::shared_ptr<Boundary> b, const std::vector<Node*>& starts) {
    std::unordered_set<Node*> seen;
    std::vector<Node*> found;
    for (Node* s : starts) ParamsOffPath(s, on_path, param_nodes, &seen, &found);
    if (found.empty()) return;
    for (Node* f : found) {
      if (++owners[f] > 1) shared = true;
      b->params.push_back(param_edge.at(f));
    }
    self->boundaries_.push_back(std::move(b));
  };
  for (std::size_t i = 0; i < roots.size(); ++i) {
    Node* f = root_edges[i].function.get();
    if (!f || on_path.at(f)) continue;
    auto b = std::make_shared<Boundary>();
    b->roots = {root_edges[i]};
    b->grads = {root_grads.empty() ? at::ones_like(roots[i]) : root_grads[i]};
    add(std::move(b), {f});
  }
  for (const auto& [node, path] : on_path) {
    if (!path) continue;
    std::vector<Node*> off;
    for (const Edge& e : node->next_edges())
      if (e.function && !on_path.at(e.function.get())) off.push_back(e.function.get());
    if (off.empty()) continue;
    auto b = std::make_shared<Boundary>();
    b->node = node->shared_from_this();
    add(std::move(b), off);
  }
  self->split_ = !shared;
  if (self->split_) {
    for (auto& b : self->boundaries_)
      if (b->node) b->node->add_pre_hook(std::make_unique<Capture>(b));
  } else {
    self->boundaries_.clear();
  }

  std::vector<at::Tensor> grads(inputs.size());
  if (!inputs.empty()) {
    grads = torch::autograd::grad(roots, inputs, root_grads, /*retain_graph=*/true, /*create_graph=*/false,
                                  /*allow_unused=*/true);
  }
  for (auto& b : self->boundaries_) b->capturing = false;
  *weights = std::move(self);
  return grads;
}

void SplitBackward::WeightPass() {
  if (!split_) {
    torch::autograd::backward(roots_, root_grads_, /*retain_graph=*/false, /*create_graph=*/false, params_);
  } else {
    auto& engine = torch::autograd::Engine::get_default_engine();
    for (auto& b : boundaries_) {
      std::vector<Edge> edges;
      std::vector<at::Tensor> grads;
      if (b->node) {
        for (std::size_t i = 0; i < b->grads.size(); ++i) {
          if (!b->grads[i].defined()) continue;
          edges.emplace_back(b->node, static_cast<uint32_t>(i));
          grads.push_back(b->grads[i]);
        }
      } else {
        edges = b->roots;
        grads = b->grads;
      }
      if (edges.empty()) continue;  // nothing reached it: its parameters get no gradient
      engine.execute(edges, grads, /*keep_graph=*/true, /*create_graph=*/false, /*accumulate_grad=*/true, b->params);
      b->grads.clear();
    }
  }
  boundaries_.clear();
  roots_.clear();
  root_grads_.clear();
}

int64_t SplitBackward::kept_bytes() const {
  int64_t n = 0;
  for (const at::Tensor& g : root_grads_)
    if (g.defined()) n += static_cast<int64_t>(g.numel() * g.element_size());
  for (const auto& b : boundaries_)
    if (b->node)
      for (const at::Tensor& g : b->grads)
        if (g.defined()) n += static_cast<int64_t>(g.numel() * g.element_size());
  return n;
}

}  // namespace conveyor
