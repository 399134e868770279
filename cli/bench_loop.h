#pragma once

// fax-run bench's peers: FedAvg written the way a LibTorch user writes it without fax (modules,
// torch::optim::SGD, one client after another), for the built-in MLP, CNN and LeNet as torch::nn
// modules and for a TorchScript module; and that TorchScript module, built in C++ (no Python needed).

#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <fax/train/dataset.h>

namespace fax::cli {

/// A model as the idiomatic loop sees it: its parameters (trained in place) and its forward.
struct LoopModel {
  std::vector<at::Tensor> params;
  std::function<at::Tensor(const at::Tensor&)> forward;
};

/// McMahan et al.'s MLP (784-200-200-10) and CNN (conv 5x5 32, pool, conv 5x5 64, pool, dense 512,
/// 10; "same" padding), and the non-IID benchmark's LeNet (conv 5x5 6, pool, conv 5x5 16, pool,
/// "valid" padding, dense 120, 84, 10): the architectures of fax's `mlp`, `cnn` and `lenet`.
enum class LoopNet { mlp, cnn, lenet };
LoopModel torch_nn_model(LoopNet net);
/// The TorchScript module at `path`.
LoopModel torchscript_model(const std::string& path);

/// Saves McMahan et al.'s MLP as a TorchScript module at `path`, compiled from TorchScript source
/// with torch::jit::Module::define: what torch.jit.script makes in Python.
void save_torchscript_mlp(const std::string& path);

/// FedAvg rounds as a LibTorch user writes them: per client of round r's cohort (fax's draw,
/// sample_cohort(data, cohort, 0, r)), load the server parameters into the model, then for each of
/// `epochs` passes torch::optim::SGD steps (forward, cross-entropy, backward; a new optimizer per
/// client, so its momentum starts at zero) over shuffled minibatches of `batch`; the server moves by
/// the example-weighted mean of the clients' updates. Returns a function that runs round r.
std::function<void(int64_t)> loop_rounds(const FederatedDataset& data, int64_t cohort, LoopModel model, int64_t batch,
                                         double lr, int64_t epochs = 1, double momentum = 0);

}  // namespace fax::cli
