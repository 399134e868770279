#pragma once

#include <memory>
#include <string>

#include <fax/nn/model.h>

namespace fax {

/// A model loaded from a TorchScript file (torch.jit.save of a scripted or traced nn.Module):
/// its named_parameters() are the parameter tree, with their values in the file as the initial
/// parameters; its floating-point buffers (BatchNorm's running statistics) join the tree as
/// buffers (Model::is_buffer), integer ones (num_batches_tracked) stay in the module. forward(x)
/// maps a batch of inputs to logits [batch, classes] (or [batch, tokens, vocabulary]); a method
/// loss(logits, labels) returning one value per label replaces the cross-entropy.
///
/// Runs per client: batched parameters [k, ...] run the module once per client on that client's
/// rows. Each thread uses its own copy of the module, the graph executor's optimisations are off
/// (the interpreter runs the graph as saved: the same ops, so the same bits, on every executor and
/// differentiable to any order). The file's size and hash are part of describe(), so they are part
/// of the experiment's identity. Throws fax::Error naming `path` when the file is missing, is not a
/// module, its forward does not map the data set's inputs to one logit per class, it draws random
/// numbers (not repeatable: LibTorch's global generator) or ties weights.
std::unique_ptr<Model> load_torchscript_model(const std::string& path, const ModelShape& shape);

}  // namespace fax
