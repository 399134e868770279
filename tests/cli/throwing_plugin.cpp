// A valid plugin that throws from init() or round(): an int (not a std::exception) or a
// std::runtime_error, as its keys say. fax must report it as one line naming the plugin.
#include <stdexcept>

#include <fax/fax.h>

namespace {

class Throwing final : public fax::Algorithm {
 public:
  static constexpr const char* name = "throwing";
  static constexpr const char* description = "throws from init or round (tests)";
  static std::vector<fax::ConfigKey> keys() {
    return {fax::string_key("throw_in", "round", "where to throw", {"init", "round"}),
            fax::string_key("throw_what", "int", "what to throw", {"int", "std"}),
            fax::int_key("throw_from_round", "0", "round() throws from this (0-based) round on", 0)};
  }

  fax::ServerState init(const fax::Config& config, const fax::Model&, fax::TensorTree params) override {
    in_round_ = config.get_string("algorithm.throw_in") == "round";
    throw_int_ = config.get_string("algorithm.throw_what") == "int";
    from_round_ = config.get_int("algorithm.throw_from_round");
    if (!in_round_) fail();
    return {std::move(params), {}};
  }

  fax::RoundMetrics round(fax::ServerState&, fax::RoundContext& ctx) const override {
    if (ctx.round >= from_round_) fail();
    return {};
  }

 private:
  void fail() const {
    if (throw_int_) throw 42;
    throw std::runtime_error("boom from the plugin");
  }
  bool in_round_ = true;
  bool throw_int_ = true;
  int64_t from_round_ = 0;
};

}  // namespace

FAX_PLUGIN(Throwing)
