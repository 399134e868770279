#include <fax/base/settings.h>
#include <fax/train/plugin.h>

#include "helpers.h"

namespace fax {
namespace {

struct Part {
  int64_t clients = 100;
  std::string kind = "iid";
};

struct Options {
  double lr = 1.0;
  int64_t steps = 3;
  uint64_t seed = 7;
  bool adaptive = false;
  std::string optimizer = "adam";
  Part part{600, "dirichlet"};  // defaults of its own, not Part's
};

Settings<Part> part_settings() {
  return Settings<Part>()
      .add("clients", &Part::clients, "clients", at_least(1))
      .add("kind", &Part::kind, "how to split", one_of({"iid", "dirichlet"}));
}

Settings<Options> options_settings() {
  return Settings<Options>()
      .add("lr", &Options::lr, "learning rate", positive())
      .add("steps", &Options::steps, "steps", in(1, 10))
      .add("seed", &Options::seed, "seed")
      .add("adaptive", &Options::adaptive, "adapt")
      .add("optimizer", &Options::optimizer, "optimizer", one_of({"adam", "sgd"}))
      .include(&Options::part, part_settings());
}

Config resolved(const std::vector<std::pair<std::string, std::string>>& settings) {
  Schema schema;
  schema.add_all(options_settings().keys(), "algorithm");
  Config config;
  for (const auto& [name, text] : settings) config.set(name, text, {"test", 0, 0});
  config.resolve(schema);
  return config;
}

TEST(Settings, KeysCarryTypesDefaultsAndRangesFromOneDeclaration) {
  const std::vector<ConfigKey> keys = options_settings().keys();
  ASSERT_EQ(keys.size(), 7u);
  std::vector<std::string> names, defaults;
  for (const auto& k : keys) {
    names.push_back(k.name);
    defaults.push_back(k.default_value);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"lr", "steps", "seed", "adaptive", "optimizer", "clients", "kind"}));
  // Floats keep a decimal point; the included part's defaults are the outer struct's member's.
  EXPECT_EQ(defaults, (std::vector<std::string>{"1.0", "3", "7", "false", "adam", "600", "dirichlet"}));
  EXPECT_EQ(keys[0].type, KeyType::Float);
  EXPECT_EQ(keys[1].type, KeyType::Int);
  EXPECT_EQ(keys[2].type, KeyType::Int);
  EXPECT_EQ(keys[3].type, KeyType::Bool);
  EXPECT_EQ(keys[4].type, KeyType::String);
  EXPECT_EQ(describe_constraints(keys[0]), "> 0");
  EXPECT_EQ(describe_constraints(keys[1]), "in [1, 10]");
  EXPECT_EQ(describe_constraints(keys[2]), ">= 0");  // unsigned
  EXPECT_EQ(describe_constraints(keys[4]), "one of adam, sgd");
  EXPECT_EQ(keys[0].doc, "learning rate");
}

TEST(Settings, ReadFillsEveryMemberFromItsSection) {
  const Options defaults = options_settings().read(resolved({}), "algorithm");
  EXPECT_EQ(defaults.lr, 1.0);
  EXPECT_EQ(defaults.steps, 3);
  EXPECT_EQ(defaults.seed, 7u);
  EXPECT_FALSE(defaults.adaptive);
  EXPECT_EQ(defaults.optimizer, "adam");
  EXPECT_EQ(defaults.part.clients, 600);
  EXPECT_EQ(defaults.part.kind, "dirichlet");

  const Options set = options_settings().read(
      resolved({{"algorithm.lr", "0.25"}, {"algorithm.steps", "9"}, {"algorithm.seed", "12345678901"},
                {"algorithm.adaptive", "yes"}, {"algorithm.optimizer", "sgd"}, {"algorithm.clients", "5"},
                {"algorithm.kind", "iid"}}),
      "algorithm");
  EXPECT_EQ(set.lr, 0.25);
  EXPECT_EQ(set.steps, 9);
  EXPECT_EQ(set.seed, 12345678901u);
  EXPECT_TRUE(set.adaptive);
  EXPECT_EQ(set.optimizer, "sgd");
  EXPECT_EQ(set.part.clients, 5);
  EXPECT_EQ(set.part.kind, "iid");
}

TEST(Settings, TheTableValidatesWhatUsersWrite) {
  EXPECT_EQ(test::error_of([] { resolved({{"algorithm.lr", "0"}}); }),
            "test: algorithm.lr: 0 is out of range (must be > 0)");
  EXPECT_EQ(test::error_of([] { resolved({{"algorithm.steps", "11"}}); }),
            "test: algorithm.steps: 11 is out of range (must be in [1, 10])");
  EXPECT_EQ(test::error_of([] { resolved({{"algorithm.seed", "-1"}}); }),
            "test: algorithm.seed: -1 is out of range (must be >= 0)");
  EXPECT_EQ(test::error_of([] { resolved({{"algorithm.kind", "shards"}}); }),
            "test: algorithm.kind: 'shards' is not one of: iid, dirichlet");
}

struct Seeded {
  uint64_t seed = 0;
  uint64_t huge = ~uint64_t{0};
};

TEST(Settings, TablesRefuseTheirOwnMistakes) {
  // A key bound twice, directly or through an included part.
  EXPECT_THROW(Settings<Part>().add("clients", &Part::clients, "a").add("clients", &Part::clients, "b"), InternalError);
  EXPECT_THROW(Settings<Options>().add("kind", &Options::optimizer, "a").include(&Options::part, part_settings()),
               InternalError);
  // An unsigned setting: its lower bound is at least 0, an exclusive 0 stays exclusive, and a
  // default beyond what a Config holds (int64) is refused.
  const auto keys = Settings<Seeded>().add("seed", &Seeded::seed, "s", above(0)).keys();
  EXPECT_EQ(describe_constraints(keys[0]), "> 0");
  EXPECT_EQ(describe_constraints(Settings<Seeded>().add("seed", &Seeded::seed, "s", above(-1)).keys()[0]), ">= 0");
  EXPECT_THROW(Settings<Seeded>().add("huge", &Seeded::huge, "h"), InternalError);
}

struct WithSettings {
  static const Settings<Part>& settings() {
    static const Settings<Part> table = part_settings();
    return table;
  }
};

struct WithKeys {
  static std::vector<ConfigKey> keys() { return {int_key("n", "1", "n")}; }
};

TEST(Settings, PluginsDeclareEitherASettingsTableOrKeys) {
  const auto from_table = detail::plugin_keys<WithSettings>();
  ASSERT_EQ(from_table.size(), 2u);
  EXPECT_EQ(from_table[0].name, "clients");
  EXPECT_EQ(from_table[0].default_value, "100");
  const auto from_keys = detail::plugin_keys<WithKeys>();
  ASSERT_EQ(from_keys.size(), 1u);
  EXPECT_EQ(from_keys[0].name, "n");
}

}  // namespace
}  // namespace fax
