// The small regression problem the mixed-precision tests train: Linear(4 -> 3) -> ReLU ->
// Linear(3 -> 1), MSE on random data, with or without autocast.
#pragma once

#include <vector>

#include "amp/autocast.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "test_util.h"

namespace minamp::test {

struct Problem {
  Rng rng{21};
  nn::Sequential model;
  Tensor x, y;
  Problem() {
    model.emplace<nn::Linear>(4, 3, rng).emplace<nn::ReLU>().emplace<nn::Linear>(3, 1, rng);
    Rng data(5);
    x = random_tensor(data, {16, 4});
    y = random_tensor(data, {16, 1});
  }
  Var loss(bool amp) {
    amp::Autocast autocast(amp);
    return ops::mse_loss(model(Var(x)), y);
  }
  std::vector<float> flat_parameters() {
    std::vector<float> out;
    for (Parameter* p : model.parameters())
      for (float v : p->master().to_vector()) out.push_back(v);
    return out;
  }
};

} // namespace minamp::test
