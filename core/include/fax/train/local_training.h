#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fax/base/tensor_tree.h>
#include <fax/nn/model.h>
#include <fax/spmd/primitives.h>
#include <fax/train/dataset.h>

namespace fax {

/// One step's minibatch of a chunk of k clients.
struct Batch {
  at::Tensor x;     ///< [k, B, ...features]
  at::Tensor y;     ///< [k, B]
  at::Tensor mask;  ///< [k, B], 1 for a real example of the step, 0 for an unused slot
};

/// The minibatches of local training for a chunk of clients. Each client's examples are shuffled
/// by its own random stream every epoch and cut into batches of `batch_size` (the last one of an
/// epoch may be short). Step s holds every client's s-th batch. Clients with fewer or shorter
/// batches are masked, never padded with made-up data: an unused slot repeats one of the client's
/// own examples with weight 0, so it changes nothing. When the data set asks for augmentation (and
/// `augment`), each client draws its examples' crops and flips from its stream after its shuffles.
class ClientBatches {
 public:
  /// batch_size 0: each client's whole data set is one batch per epoch.
  ClientBatches(const ClientChunk& chunk, const FederatedDataset& data, int64_t epochs, int64_t batch_size,
                bool augment = true);

  int64_t steps() const { return index_.size(0); }
  int64_t clients() const { return index_.size(1); }
  int64_t batch_size() const { return index_.size(2); }
  /// Step `step`, as narrow as its widest client: x [k, w, ...] with w <= B that client's count of
  /// real examples in the step. An epoch's short last batch leaves its unused slots at the end of
  /// every client's row, so those are not computed (a step of 2 examples in 10 slots costs 2).
  /// `clients` (chunk positions, [k'] long) keeps those clients' rows only; undefined: all.
  Batch batch(int64_t step, const at::Tensor& clients = {}) const;
  /// Steps first .. first + count - 1 back to back, each B slots wide: x [k, count * B, ...], y and
  /// mask [k, count * B]; `clients` as for batch().
  Batch batches(int64_t first, int64_t count, const at::Tensor& clients = {}) const;
  /// Examples per client, [k] float.
  const at::Tensor& examples() const { return examples_; }
  /// Real examples per step and client, [steps, k] float (the mask summed over slots).
  const at::Tensor& counts() const { return counts_; }
  /// The fewest real examples any client has in step `step` (equal to a batch's width: no unused slot).
  int64_t fewest(int64_t step) const { return fewest_.at(step); }
  /// Steps in which each client has at least one real example, [k] float (SCAFFOLD's K_i).
  at::Tensor client_steps() const;
  /// Real examples in step `step`, over all clients.
  int64_t real(int64_t step) const { return real_.at(step); }

 private:
  at::Tensor x_;      // the data set's pool, or the chunk's examples concatenated client after client
  at::Tensor y_;
  at::Tensor index_;  // [steps, k, B] rows of x_
  at::Tensor mask_;   // [steps, k, B]
  std::optional<Augmentation> augmentation_;
  at::Tensor draws_;  // [steps, k, B, 3]: each slot's crop offsets (rows, columns) and flip
  at::Tensor counts_;
  at::Tensor examples_;
  std::vector<int64_t> widths_;  // per step: the most real examples any client has in it
  std::vector<int64_t> fewest_;  // per step: the fewest
  std::vector<int64_t> real_;    // per step: the sum

  // Rows `index` [k, rows] of the examples, with their mask [k, rows] and augmentation draws [k, rows, 3].
  Batch gather(const at::Tensor& index, const at::Tensor& mask, const at::Tensor& draws) const;
};

struct LocalSgdOptions {
  /// Keep the graph through every step (for derivatives through local training: hypergradients).
  bool create_graph = false;
  /// Optional extra per-client loss on the current parameters, e.g. FedProx's proximal term. It
  /// gets the rows of the clients still training (local_sgd) and their positions in the chunk
  /// ([k'] long; undefined while every client trains), and returns one value per row ([k']).
  std::function<at::Tensor(const TensorTree& params, const at::Tensor& clients)> penalty;
  /// SGD with momentum and weight decay as PyTorch's torch.optim.SGD (no dampening, not Nesterov):
  /// g = dL/dp + weight_decay p, v = momentum v + g (v = g at the first step), p -= lr v. The
  /// velocity starts at zero every round, as when a client builds its optimizer afresh.
  double momentum = 0.0;
  double weight_decay = 0.0;
  /// Per client, a fixed direction every step adds outside momentum and weight decay:
  /// p -= lr (v + correction), rows [k, ...] for each trained leaf, by name (SCAFFOLD's c - c_i,
  /// applied as its reference implementations apply it, after the optimizer's step: through the
  /// velocity it would be amplified by up to 1 / (1 - momentum)).
  TensorTree correction{};
  /// When the model has an input layer z = x W + b (Model::input_layer) and none of the above
  /// is set, step that layer in factored form. Over one client's steps W_s = W_0 - sum_{t<s} x_t^T
  /// u_t with u_t = lr dL_t/dz_t, so x_s W_s = x_s W_0 - sum_{t<s} (x_s x_t^T) u_t: for a block of
  /// steps whose rows number about half the layer's outputs, W enters one product up front and one
  /// at the end, plus the rows' Gram matrix, instead of three small products and an update every
  /// step that each stream all of W through memory. Same maths; the rounding differs.
  bool factor_input_layer = true;
  /// With the input layer factored and every step in one block: leave its trained weights as
  /// factors (LocalSgdResult::input_factors) instead of forming W_0 - X^T U for every client, for
  /// callers that only need a weighted sum over clients, sum_i w_i X_i^T U_i: one product.
  bool defer_input_layer = false;
};

/// The input layer's update in factored form: client i moved its weight by -x[i]^T u[i].
struct InputLayerFactors {
  std::string weight;  ///< the leaf
  at::Tensor x;        ///< [k, rows, features]: the client's rows, step after step
  at::Tensor u;        ///< [k, rows, outputs]: the step size times dL/dz of each row
};

struct LocalSgdResult {
  TensorTree params;  ///< [k, ...] after the last step (without input_factors->weight when set)
  at::Tensor loss;    ///< [k] mean training loss over the examples seen
  std::optional<InputLayerFactors> input_factors;
};

/// Mini-batch SGD on a chunk of clients at once: params [k, ...], learning rate `lr` (0-dim or
/// [k]). Each client minimises the mean cross-entropy of its batch; masked slots weigh nothing and
/// a client whose steps are over stays where it is. Clients of a chunk often have different step
/// counts (ragged data sets): a client whose steps are over leaves the computation (at the next
/// step, or with the input layer factored, the next block of steps), so a chunk computes on the
/// clients still training; the rows of a batched product do not depend on one another, so every
/// client's result is the bits it gets in any chunk. Not with create_graph, nor for a model with
/// buffers (its forward passes update them on masked steps too).
LocalSgdResult local_sgd(const Model& model, const ClientBatches& batches, const TensorTree& params,
                         const at::Tensor& lr, const LocalSgdOptions& options = {});

/// Batch rows local training computed in this process (all threads), and those holding a real
/// example: 1 - real / computed is the share of its work spent on masked slots. For the bench.
struct RowSteps {
  int64_t computed = 0;
  int64_t real = 0;
};
RowSteps local_training_row_steps();

}  // namespace fax
