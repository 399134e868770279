#pragma once

// fax-run bench's TorchScript case: a module built in C++ (no Python needed to bench), and the
// idiomatic LibTorch loop over clients it is compared with.

#include <functional>
#include <string>

#include <fax/base/cohort.h>
#include <fax/train/dataset.h>

namespace fax::cli {

/// Saves McMahan et al.'s MLP (784-200-200-10) as a TorchScript module at `path`, compiled from
/// TorchScript source with torch::jit::Module::define: what torch.jit.script makes in Python.
void save_torchscript_mlp(const std::string& path);

/// One FedAvg round's client work as a LibTorch user writes it for a TorchScript model: per client,
/// load the server parameters into the module, torch::optim::SGD over its parameters, forward,
/// cross-entropy, backward, step for each minibatch of `batch`; then the example-weighted sum of
/// the clients' updates. Returns a function that runs one round.
std::function<void()> torchscript_loop_round(const FederatedDataset& data, const Cohort& cohort,
                                             const std::string& path, int64_t batch, double lr);

}  // namespace fax::cli
