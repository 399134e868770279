// DP-FedAvg (McMahan et al. 2018) with optional adaptive clipping (Andrew et al. 2021), as a preset
// of the aggregation pipeline: FedAvg whose updates go through `clip` (fixed, or adaptive toward a
// quantile of the update norms) and `gaussian` (noise z C on the sum, which is divided by the
// cohort size; the ledger logs epsilon every round). The keys are the plugin's own, kept from when
// it did this by itself; `aggregation: [{clip: ...}, {gaussian: ...}]` under fedavg is the same
// round, and combines with the other stages.

#include <cmath>
#include <memory>

#include <fmt/format.h>

#include <fax/fax.h>

namespace {

constexpr const char* kStages = "clip,gaussian";

class DpFedAvg final : public fax::Algorithm {
 public:
  static constexpr const char* name = "dp_fedavg";
  static constexpr const char* description =
      "DP-FedAvg: FedAvg through the aggregation pipeline clip (adaptive optional), gaussian; epsilon logged every round";

  struct Options {
    fax::ClientTrainingOptions client;
    double server_lr = 1.0;
    double clip_norm = 1.0;
    double noise_multiplier = 1.0;
    bool adaptive_clipping = false;
    double target_quantile = 0.5;
    double clip_lr = 0.2;
    double count_noise = 0.0;
    double delta = 1e-5;
    std::string accountant = "rdp";
  };

  static const fax::Settings<Options>& settings() {
    static const fax::Settings<Options> table = fax::Settings<Options>()
        .include(&Options::client, fax::client_training_settings())
        .add("server_lr", &Options::server_lr, "server learning rate on the noised mean update", fax::positive())
        .add("clip_norm", &Options::clip_norm, "L2 norm each client update is clipped to (initial C)", fax::positive())
        .add("noise_multiplier", &Options::noise_multiplier, "z: noise std on the sum is z * C; 0: no noise",
             fax::at_least(0))
        .add("adaptive_clipping", &Options::adaptive_clipping, "move C toward a quantile of the update norms")
        .add("target_quantile", &Options::target_quantile, "adaptive clipping: share of updates left unclipped",
             fax::in(0, 1))
        .add("clip_lr", &Options::clip_lr, "adaptive clipping: geometric step on C", fax::positive())
        .add("count_noise", &Options::count_noise, "adaptive clipping: noise std on the unclipped count", fax::at_least(0))
        .add("delta", &Options::delta, "delta of the reported (epsilon, delta)", fax::above(0, 1))
        .add("accountant", &Options::accountant, "rdp (Renyi) or pld (privacy loss distribution)",
             fax::one_of({"rdp", "pld"}));
    return table;
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    o_ = settings().read(config, "algorithm");
    training_ = fax::client_training(o_.client);
    FAX_CHECK(!o_.adaptive_clipping || o_.noise_multiplier == 0 || o_.count_noise > 0,
              "{}: adaptive clipping with noise needs algorithm.count_noise > 0: the unclipped count is released too",
              config.origin("algorithm.count_noise").str());
    FAX_CHECK(o_.delta < 1, "{}: algorithm.delta is 1: an (epsilon, 1) guarantee promises nothing; take delta below 1 / "
              "population (e.g. 1e-5)", config.origin("algorithm.delta").str());
    FAX_CHECK(o_.accountant != "pld" || o_.delta >= 1e-9,
              "{}: algorithm.delta {} is below what the pld accountant resolves (1e-9): use accountant: rdp",
              config.origin("algorithm.delta").str(), o_.delta);
    // The pipeline's settings, each from the key it came from (for messages).
    fax::Config preset;
    const auto set = [&](const char* key, const std::string& value, const char* from) {
      preset.set(std::string("aggregation.") + key, value, config.origin(std::string("algorithm.") + from));
    };
    const auto number = [](double v) { return fmt::format("{}", v); };
    set("stages", kStages, "clip_norm");
    set("clip.norm", number(o_.clip_norm), "clip_norm");
    set("clip.adaptive", o_.adaptive_clipping ? "true" : "false", "adaptive_clipping");
    set("clip.target_quantile", number(o_.target_quantile), "target_quantile");
    set("clip.clip_lr", number(o_.clip_lr), "clip_lr");
    set("clip.count_noise", number(o_.count_noise), "count_noise");
    set("gaussian.noise_multiplier", number(o_.noise_multiplier), "noise_multiplier");
    set("gaussian.delta", number(o_.delta), "delta");
    set("gaussian.accountant", o_.accountant, "accountant");
    fax::Schema schema;
    for (fax::ConfigKey& k : fax::aggregation_schema()) schema.add(std::move(k));
    for (fax::ConfigKey& k : fax::aggregation_keys(kStages, name)) schema.add(std::move(k));
    preset.resolve(schema);
    pipeline_ = std::make_unique<fax::Aggregation>(preset, /*population=*/0, /*seed=*/0);
    // The pipeline's server state (adaptive clipping's C) is this algorithm's.
    return {std::move(params), pipeline_->initial_state()};
  }

  int64_t local_examples(int64_t examples) const override { return fax::local_examples(training_, examples); }
  fax::RoundMetrics round(fax::ServerState& state, fax::RoundContext& ctx) const override {
    FAX_CHECK(ctx.aggregation == nullptr || ctx.aggregation->plain(),
              "dp_fedavg is FedAvg through the aggregation stages {}; with the experiment's aggregation stages or "
              "clients.byzantine, use fedavg and list every stage in aggregation:", kStages);
    fax::RoundContext own = ctx;
    own.aggregation = pipeline_.get();
    own.aggregation_state = &state.extra;
    const fax::RoundUpdate update = fax::mean_client_update(own, state.params, training_);
    state.params = fax::axpy(-o_.server_lr, update.mean, state.params);
    return fax::round_metrics(own, update);
  }

  bool adds_noise() const override { return o_.noise_multiplier > 0; }

  void check_state(const fax::ServerState& state, const std::string& where) const override {
    if (!o_.adaptive_clipping) return;
    const double clip = state.extra.at("clip/norm").item<double>();
    FAX_CHECK(std::isfinite(clip) && clip > 0,
              "{}: dp_fedavg's adaptive clip norm (extra/clip/norm) is {}; it must be finite and positive", where, clip);
  }

 private:
  fax::ClientTraining training_;
  Options o_;
  std::unique_ptr<fax::Aggregation> pipeline_;
};

}  // namespace

FAX_PLUGIN(DpFedAvg)
