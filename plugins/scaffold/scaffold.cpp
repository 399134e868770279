// SCAFFOLD (Karimireddy et al. 2020), control variates "option II": each client corrects its local
// steps by c - c_i (server and client control variates); after K_i local steps at client lr
// eta_l it sets c_i+ = c_i - c + (x - y_i) / (K_i eta_l). With client momentum the correction is
// added after the momentum step, as in the NIID-Bench code (Li et al. 2022): c_i then estimates
// the momentum-amplified gradient, which through the velocity would be amplified once more. The server moves x by server_lr times the
// mean client update and c by |S| / N times the mean change of the c_i. The c_i live in the
// per-client state store and are saved in checkpoints.

#include <ATen/ATen.h>

#include <fax/fax.h>

namespace {

class Scaffold final : public fax::Algorithm {
 public:
  static constexpr const char* name = "scaffold";
  static constexpr const char* description =
      "SCAFFOLD: local SGD corrected by server and client control variates (Karimireddy et al. 2020)";

  struct Options {
    fax::ClientTrainingOptions client;
    double server_lr = 1.0;
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .include(&Options::client, fax::client_training_settings())
        .add("server_lr", &Options::server_lr, "global (server) learning rate", fax::positive());
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    const Options o = settings().read(config, "algorithm");
    training_ = fax::client_training(o.client);
    server_lr_ = o.server_lr;
    client_lr_ = o.client.client_lr;
    fax::TensorTree control = fax::prefixed(fax::zeros_like(params), "control/");
    return {std::move(params), std::move(control)};
  }

  int64_t local_examples(int64_t examples) const override { return fax::local_examples(training_, examples); }
  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    const fax::TensorTree c = fax::unprefixed(state.extra, "control/");
    const fax::TensorTree zeros = fax::zeros_like(state.params);
    fax::ClientTraining training = training_;
    // The correction (c - c_i) needs no derivative, so the server's c can be read directly inside
    // the client function.
    training.customize = [&](const fax::ClientChunk& chunk, const fax::TensorTree&) {
      fax::LocalSgdOptions options;
      options.correction = fax::zip_map(ctx.client_states.gather(chunk, zeros), c,
                                        [](const at::Tensor& ci, const at::Tensor& cs) { return cs - ci; });
      return options;
    };
    // c_i+ = c_i - c + (x - y_i) / (K_i eta_l); returns the change c_i+ - c_i for the server.
    training.after = [&](const fax::ClientChunk& chunk, const fax::TensorTree& start, const fax::TensorTree& trained,
                         const at::Tensor& steps) {
      const fax::TensorTree ci = ctx.client_states.gather(chunk, zeros);
      const fax::TensorTree moved = fax::scale_rows(fax::sub(fax::detach(start), trained), 1.0 / (steps * client_lr_));
      fax::TensorTree change = fax::zip_map(moved, c, [](const at::Tensor& m, const at::Tensor& cs) { return m - cs; });
      // A client whose training diverged (dropped by the non-finite screen) keeps its c_i and
      // contributes no change (0, not NaN, which a zero weight would not cancel).
      at::Tensor finite = at::ones({steps.size(0)}, at::kBool);
      for (const auto& [name, t] : change) finite = finite & t.flatten(1).isfinite().all(1);
      change = change.map([&](const at::Tensor& t) {
        std::vector<int64_t> shape(t.dim(), 1);
        shape[0] = t.size(0);
        return at::where(finite.view(shape), t, at::zeros_like(t));
      });
      ctx.client_states.scatter(chunk, fax::add(ci, change));
      return change;
    };
    fax::ClientUpdates local = fax::train_clients(ctx, fax::broadcast(fax::Server<fax::TensorTree>(state.params)), training);
    // SCAFFOLD averages updates and control-variate changes uniformly over the sampled clients
    // (that took part: a client dropped for a non-finite update weighs nothing).
    const fax::TensorTree control_change = fax::weighted_mean(local.extras, local.kept).value();
    const fax::RoundUpdate update{local.losses, local.weights, local.kept, fax::weighted_mean(local.deltas, local.kept).value()};
    const double coverage = static_cast<double>(ctx.program.cohort_size()) / static_cast<double>(ctx.data.num_clients());
    state.params = fax::axpy(-server_lr_, update.mean, state.params);
    state.extra = fax::prefixed(fax::axpy(coverage, control_change, c), "control/");

    fax::RoundMetrics metrics = fax::round_metrics(ctx, update);
    metrics.server.set("train/control_norm", fax::squared_norm(c).sqrt());
    return metrics;
  }

 private:
  fax::ClientTraining training_;
  double server_lr_ = 1.0;
  double client_lr_ = 0.1;
};

}  // namespace

FAX_PLUGIN(Scaffold)
