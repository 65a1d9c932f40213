// Var: a tensor in the autograd graph. Each op result records its inputs and a backward
// closure; backward() visits the graph from the loss in reverse topological order (the graph
// *is* the tape), accumulating gradients with +=. Parameters are not Vars: ops that use them
// write their gradients straight into Parameter::grad (see nn/parameter.h).
//
// Memory follows PyTorch: a backward closure keeps only the tensors it saved, and an op's output
// lives while a Var refers to it or a closure saved it. When the last Var of an output goes (a
// residual block's last batch norm output, once the add has read it), its memory is freed and
// the node stays in the graph with the output's shape and dtype only.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/kernels.h"

namespace minamp {

struct Node {
  const char* op = "input";
  Tensor value; // undefined once no Var refers to it (a closure that needs it saved its own)
  Shape shape;  // value's, kept when value is freed
  DType dtype = DType::f32;
  Device device = Device::cpu;
  Tensor grad; // of shape and dtype; undefined until a gradient arrives
  // Set by an op whose backward sums its output's gradient per channel (a bias gradient): the op
  // that gives that gradient may compute the sums as it writes it (grad_column_sums).
  bool wants_grad_column_sums = false;
  // f32 [channels]: the sum of grad over all but its last dimension, as stored, when the op that
  // gave grad computed it; undefined otherwise (and once a second gradient is added in).
  Tensor grad_column_sums;
  // Set by an op whose backward can read its output's gradient unwritten when that gradient is a
  // batch norm's input gradient (a conv whose input needs no gradient: its weight gradient
  // computes each element as it reads it, kernels::conv2d_backward_from_batchnorm).
  bool takes_batchnorm_input_grad = false;
  // Such a gradient as its terms, in place of grad (which stays undefined), when the batch norm's
  // backward gave it that way: the node's only gradient so far (write_batchnorm_input_grad turns
  // it into grad when anything else needs it as a tensor).
  std::optional<BatchNormInputGrad> batchnorm_input_grad;
  bool requires_grad = false;
  std::vector<std::shared_ptr<Node>> inputs;
  // Reads this node's grad and accumulates into its inputs' grads (and parameters' grads).
  std::function<void(Node& self)> backward;
  // Set once backward() has run this op and freed its closure and inputs: a later backward()
  // through it is an error.
  bool released = false;

  // Frees the inputs without recursion, so that dropping a very deep graph cannot overflow the
  // stack (a backward closure holding a Var would bring recursion back: ops capture Tensors).
  ~Node();
};

class Var {
public:
  Var() = default;
  // A leaf; gradients accumulate into grad() when requires_grad.
  explicit Var(Tensor value, bool requires_grad = false);

  // The result of an op. It requires grad when any input does or when `uses_parameters`
  // (an op that writes parameter gradients needs its backward to run).
  static Var from_op(const char* op, Tensor value, const std::vector<Var>& inputs,
                     bool uses_parameters, std::function<void(Node&)> backward);

  bool defined() const { return handle_ != nullptr; }
  const Tensor& value() const { return checked_node().value; }
  const Tensor& grad() const { return checked_node().grad; }
  bool requires_grad() const { return handle_ && handle_->node->requires_grad; }
  const Shape& shape() const { return value().shape(); }
  DType dtype() const { return value().dtype(); }
  Device device() const { return value().device(); }
  Node& node() const { return checked_node(); }

  // Backpropagates from this one-element Var with a seed gradient of 1.
  void backward() const;
  // Backpropagates with an explicit seed of this Var's shape. The graph is freed as it is walked,
  // and wholly when an op's backward throws: a second backward() through it is an Error.
  void backward(const Tensor& seed) const;

private:
  // The node; throws Error when this Var is undefined (default-constructed).
  Node& checked_node() const {
    require(defined(), "Var", "used before it was given a value");
    return *handle_->node;
  }

  // What every copy of one Var shares: when the last copy goes, the node's value is freed if the
  // graph still holds the node (the graph needs its shape and dtype, not its values).
  struct Handle {
    std::shared_ptr<Node> node;
    ~Handle();
  };
  std::shared_ptr<Handle> handle_;
};

// Adds `grad` into node.grad, converting it to the node's dtype when they differ. When node.grad
// is still undefined it takes `grad` over without a copy (so one gradient can go to several
// nodes, as an add's to both its inputs); a node.grad that shares its storage is never added
// into in place, but copied first. `column_sums` (f32 [channels], or undefined) are grad's sums
// per channel: kept as node.grad_column_sums when grad is the node's first and is taken as it is.
void accumulate_grad(Node& node, const Tensor& grad, const Tensor& column_sums = Tensor());
// Adds a batch norm's input gradient into node's, given as its terms: kept as they are
// (node.batchnorm_input_grad) when the node takes them and has no gradient yet, else written (as
// batchnorm_backward writes it, over grad.dy) and added as a tensor. A tensor added later to a
// node holding the terms has them written first.
void accumulate_grad(Node& node, BatchNormInputGrad grad);
// Writes node.batchnorm_input_grad, when it holds one, into node.grad (with grad_column_sums when
// node.wants_grad_column_sums): for an op whose kernels cannot read its gradient unwritten.
void write_batchnorm_input_grad(Node& node);

// A function shown every op node whose gradient is complete, just before its backward runs
// (used by the fp16 range diagnostics). Empty by default; set per thread.
using GradObserver = std::function<void(const Node& node)>;
void set_grad_observer(GradObserver observer);

// While a NoGrad is alive on this thread, ops record no graph (inference: saved activations are
// freed as soon as they are used).
class NoGrad {
public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

private:
  bool previous_;
};
bool grad_enabled();

} // namespace minamp
