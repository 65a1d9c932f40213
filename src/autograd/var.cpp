// The autograd graph walk: topological order from the loss, closures run in reverse.
#include "autograd/var.h"

#include <unordered_set>

#include "core/error.h"
#include "kernels/kernels.h"

namespace minamp {

namespace {
thread_local bool g_grad_enabled = true;
thread_local GradObserver g_grad_observer;

// Throws Error when an earlier backward() already ran this op and freed what it saved.
void require_not_released(const Node& node) {
  require(!node.released, "backward", "the graph through ", node.op,
          " was already freed by an earlier backward() (its saved tensors are gone; run the "
          "forward pass again to build a new graph)");
}

// Post-order DFS from `root` over nodes that require grad (iterative: graphs can be deep).
// The order owns its nodes, so the walk may release each node's inputs as it goes, and then its
// own reference to the node. Throws Error,
// before any gradient is touched, when it reaches an op that an earlier backward() released.
std::vector<std::shared_ptr<Node>> topological_order(const std::shared_ptr<Node>& root) {
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<Node*> visited;
  require_not_released(*root);
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack{{root, 0}};
  visited.insert(root.get());
  while (!stack.empty()) {
    auto& [node, next_input] = stack.back();
    if (next_input < node->inputs.size()) {
      const std::shared_ptr<Node>& input = node->inputs[next_input++];
      if (!input->requires_grad || !visited.insert(input.get()).second) continue;
      require_not_released(*input);
      stack.push_back({input, 0});
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }
  return order;
}
// The batch norm input gradient `grad` describes, written over grad.dy (whose storage it owns) as
// batchnorm_backward writes it, with its sums per channel into column_sums when asked. The affine
// gradients came with the terms' making: not added again.
Tensor write_dx(const BatchNormInputGrad& grad, bool with_column_sums, Tensor& column_sums) {
  BatchNormParams bn;
  bn.training = grad.training, bn.relu = grad.relu, bn.grad_sums = &grad.grad_sums;
  if (with_column_sums) {
    column_sums = Tensor::empty({grad.x.shape().last()}, DType::f32, grad.x.device());
    bn.dx_sums = &column_sums;
  }
  Tensor dx = grad.dy, no_dgamma, no_dbeta;
  kernels::batchnorm_backward(grad.x, grad.gamma, grad.beta, grad.mean, grad.invstd, grad.dy, dx,
                              no_dgamma, no_dbeta, bn);
  return dx;
}

// Frees what an op saved, its closure and its gradient, and marks it as run.
void release(Node& node) {
  node.backward = nullptr;
  node.grad = Tensor();
  node.grad_column_sums = Tensor();
  node.batchnorm_input_grad.reset();
  node.inputs.clear();
  node.released = true;
}
} // namespace

Node::~Node() {
  // Destroying the inputs directly would run their destructors recursively, one stack frame per
  // level of the graph. Instead, an input this node owned alone hands its own inputs over to
  // `pending` before it is destroyed, so each node dies with no inputs left.
  std::vector<std::shared_ptr<Node>> pending = std::move(inputs);
  while (!pending.empty()) {
    std::shared_ptr<Node> node = std::move(pending.back());
    pending.pop_back();
    if (node.use_count() > 1) continue; // still used elsewhere: only our reference goes
    for (std::shared_ptr<Node>& input : node->inputs) pending.push_back(std::move(input));
    node->inputs.clear();
  }
}

Var::Handle::~Handle() {
  if (node.use_count() > 1) node->value = Tensor(); // the graph keeps the node, not its values
}

Var::Var(Tensor value, bool requires_grad)
    : handle_(std::make_shared<Handle>(Handle{std::make_shared<Node>()})) {
  Node& node = *handle_->node;
  node.shape = value.shape();
  node.dtype = value.dtype();
  node.device = value.device();
  node.value = std::move(value);
  node.requires_grad = requires_grad;
}

Var Var::from_op(const char* op, Tensor value, const std::vector<Var>& inputs, bool uses_parameters,
                 std::function<void(Node&)> backward) {
  Var out(std::move(value));
  Node& node = *out.handle_->node;
  node.op = op;
  if (!grad_enabled()) return out;
  bool needs_grad = uses_parameters;
  for (const Var& v : inputs) {
    require(v.defined(), op, "an input Var was used before it was given a value");
    needs_grad = needs_grad || v.requires_grad();
  }
  if (!needs_grad) return out;
  node.requires_grad = true;
  for (const Var& v : inputs) node.inputs.push_back(v.handle_->node);
  node.backward = std::move(backward);
  return out;
}

void Var::backward() const {
  require(defined(), "backward", "called on an undefined Var");
  require(value().numel() == 1, "backward",
          "backward() without a seed needs a one-element loss, got ", describe(value()));
  backward(Tensor::full(value().shape(), 1.0f, value().dtype(), value().device()));
}

void Var::backward(const Tensor& seed) const {
  require(requires_grad(), "backward",
          "this Var does not require grad (no parameter or input "
          "with requires_grad contributed to it)");
  require(seed.shape() == value().shape(), "backward", "seed ", describe(seed),
          " does not match the value ", describe(value()));
  std::vector<std::shared_ptr<Node>> order = topological_order(handle_->node);
  accumulate_grad(*handle_->node,
                  seed.clone()); // the walk may add into it: keep the caller's intact
  try {
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node& node = **it;
      if (node.backward) { // a leaf keeps its gradient
        if (node.grad.defined() || node.batchnorm_input_grad) {
          if (g_grad_observer) {
            write_batchnorm_input_grad(node); // the observer reads node.grad
            g_grad_observer(node);
          }
          node.backward(node);
        }
        release(node);
      }
      // Every op that reads this node has run and dropped it: with the walk's reference gone, a
      // node nobody else holds frees its output now, not when the walk ends. The activations so
      // leave as the gradients arrive (the gradients of the first layers are the largest).
      it->reset();
    }
  } catch (...) {
    // The ops not yet run hold partial gradients: a retry would add the seed and those again.
    // Free the whole graph instead, so that a second backward() through it is an Error.
    for (const std::shared_ptr<Node>& node : order)
      if (node && node->backward) release(*node);
    throw;
  }
}

void accumulate_grad(Node& node, const Tensor& grad, const Tensor& column_sums) {
  require(grad.shape() == node.shape, "accumulate_grad", "gradient ", describe(grad),
          " does not match the value ", node.dtype, node.shape, " of op ", node.op);
  require(!column_sums.defined() || (column_sums.dtype() == DType::f32 &&
                                     column_sums.shape() == Shape{grad.shape().last()}),
          "accumulate_grad", "column sums ", describe(column_sums), " do not match the gradient ",
          describe(grad));
  write_batchnorm_input_grad(node); // a gradient held as its terms, written to add this one
  if (!node.grad.defined()) {
    const bool as_is = grad.dtype() == node.dtype;
    node.grad = as_is ? grad : grad.to(node.dtype);
    if (as_is) node.grad_column_sums = column_sums;
    return;
  }
  node.grad_column_sums = Tensor(); // they describe the first gradient only
  if (node.grad.storage_shared()) node.grad = node.grad.clone(); // copy on write
  kernels::add_inplace(node.grad, grad, 1.0f);
}

void accumulate_grad(Node& node, BatchNormInputGrad grad) {
  require(grad.x.shape() == node.shape && grad.dy.shape() == node.shape, "accumulate_grad",
          "batch norm input gradient of x ", describe(grad.x), " does not match the value ",
          node.dtype, node.shape, " of op ", node.op);
  if (node.takes_batchnorm_input_grad && !node.grad.defined() && !node.batchnorm_input_grad) {
    node.batchnorm_input_grad = std::move(grad);
    return;
  }
  write_batchnorm_input_grad(node);
  Tensor column_sums; // kept only with the node's first gradient
  const Tensor dx =
      write_dx(grad, !node.grad.defined() && node.wants_grad_column_sums, column_sums);
  accumulate_grad(node, dx, column_sums);
}

void write_batchnorm_input_grad(Node& node) {
  if (!node.batchnorm_input_grad) return;
  BatchNormInputGrad grad = std::move(*node.batchnorm_input_grad);
  node.batchnorm_input_grad.reset();
  Tensor column_sums;
  const Tensor dx = write_dx(grad, node.wants_grad_column_sums, column_sums);
  accumulate_grad(node, dx, column_sums);
}

NoGrad::NoGrad() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGrad::~NoGrad() { g_grad_enabled = previous_; }
bool grad_enabled() { return g_grad_enabled; }
void set_grad_observer(GradObserver observer) { g_grad_observer = std::move(observer); }

} // namespace minamp
