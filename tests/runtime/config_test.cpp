#include <cmath>

#include <fax/base/config.h>
#include <fax/io/config_yaml.h>

#include "helpers.h"

namespace fax {
namespace {

Schema test_schema() {
  Schema s;
  s.add(int_key("rounds", "10", "rounds", 1));
  s.add(float_key("algorithm.client_lr", "0.1", "lr", 0, 1, true));
  s.add(bool_key("logging.per_client", "false", "per client"));
  s.add(string_key("data.name", "synthetic", "data", {"synthetic", "fmnist"}));
  s.add(int_key("execution.executors", "1", "executors", 1, 64));
  return s;
}

TEST(Config, ResolvesTypesDefaultsAndOverrides) {
  Config c = parse_config("rounds: 30\nalgorithm:\n  client_lr: 0.5\n", "exp.yaml");
  apply_override(c, "logging.per_client=yes");
  apply_override(c, "rounds=40");
  c.resolve(test_schema());
  EXPECT_EQ(c.get_int("rounds"), 40);
  EXPECT_DOUBLE_EQ(c.get_float("algorithm.client_lr"), 0.5);
  EXPECT_TRUE(c.get_bool("logging.per_client"));
  EXPECT_EQ(c.get_string("data.name"), "synthetic");
  EXPECT_EQ(c.get_int("execution.executors"), 1);
  EXPECT_EQ(c.origin("algorithm.client_lr").str(), "exp.yaml:3:14");
  EXPECT_EQ(c.origin("rounds").str(), "--set rounds=40");
  EXPECT_EQ(c.origin("data.name").str(), "default of data.name");
}

TEST(Config, UnknownKeyNamesPlaceAndSuggestion) {
  Config c = parse_config("rounds: 3\nalgorithm:\n  client_lrr: 0.1\n", "exp.yaml");
  EXPECT_EQ(test::error_of([&] { c.resolve(test_schema()); }),
            "exp.yaml:3:3: unknown key 'algorithm.client_lrr' (did you mean 'algorithm.client_lr'?)");
  Config section_typo = parse_config("algoritm:\n  client_lr: 0.1\n", "exp.yaml");
  EXPECT_EQ(test::error_of([&] { section_typo.resolve(test_schema()); }),
            "exp.yaml:2:3: unknown key 'algoritm.client_lr' (did you mean 'algorithm.client_lr'?)");
  Config far = parse_config("colour: blue\n", "exp.yaml");
  EXPECT_EQ(test::error_of([&] { far.resolve(test_schema()); }), "exp.yaml:1:1: unknown key 'colour'");
}

TEST(Config, WrongTypeOutOfRangeAndChoices) {
  auto resolve = [](const std::string& yaml) {
    Config c = parse_config(yaml, "e.yaml");
    c.resolve(test_schema());
  };
  EXPECT_EQ(test::error_of([&] { resolve("rounds: 2.5\n"); }), "e.yaml:1:9: rounds: expected an integer, got '2.5'");
  EXPECT_EQ(test::error_of([&] { resolve("logging:\n  per_client: maybe\n"); }),
            "e.yaml:2:15: logging.per_client: expected a bool, got 'maybe'");
  EXPECT_EQ(test::error_of([&] { resolve("algorithm:\n  client_lr: fast\n"); }),
            "e.yaml:2:14: algorithm.client_lr: expected a float, got 'fast'");
  EXPECT_EQ(test::error_of([&] { resolve("rounds: 0\n"); }), "e.yaml:1:9: rounds: 0 is out of range (must be >= 1)");
  EXPECT_EQ(test::error_of([&] { resolve("algorithm:\n  client_lr: 0\n"); }),
            "e.yaml:2:14: algorithm.client_lr: 0 is out of range (must be in (0, 1])");
  EXPECT_EQ(test::error_of([&] { resolve("execution:\n  executors: 65\n"); }),
            "e.yaml:2:14: execution.executors: 65 is out of range (must be in [1, 64])");
  EXPECT_EQ(test::error_of([&] { resolve("data:\n  name: cifar\n"); }),
            "e.yaml:2:9: data.name: 'cifar' is not one of: synthetic, fmnist");
  EXPECT_EQ(test::error_of([&] { resolve("rounds: nan\n"); }), "e.yaml:1:9: rounds: expected an integer, got 'nan'");
}

TEST(Config, RejectsMalformedDocuments) {
  EXPECT_EQ(test::error_of([] { parse_config("rounds: 3\nrounds: 4\n", "e.yaml"); }),
            "e.yaml:2:1: duplicate key 'rounds' (first set at e.yaml:1:1)");
  EXPECT_EQ(test::error_of([] { parse_config("rounds: [1, 2]\n", "e.yaml"); }),
            "e.yaml:1:1: key 'rounds' holds a list; it takes a single value");
  EXPECT_EQ(test::error_of([] { parse_config("rounds:\n", "e.yaml"); }), "e.yaml:1:1: key 'rounds' has no value");
  EXPECT_EQ(test::error_of([] { parse_config("[a, b]: 1\n", "e.yaml"); }),
            "e.yaml:1:1: a key must be a plain name, not a list or a mapping");
  EXPECT_EQ(test::error_of([] { parse_config("- 1\n- 2\n", "e.yaml"); }),
            "e.yaml:1:1: an experiment is a YAML mapping of keys to values");
  const std::string syntax = test::error_of([] { parse_config("a: [1,\nb: 2\n", "e.yaml"); });
  EXPECT_EQ(syntax.rfind("e.yaml:", 0), 0u) << syntax;
  EXPECT_NE(syntax.find("YAML syntax error"), std::string::npos) << syntax;
  EXPECT_EQ(test::error_of([] { load_config("/nonexistent/exp.yaml"); }),
            "/nonexistent/exp.yaml: cannot open the experiment file: No such file or directory");
  EXPECT_EQ(test::error_of([] { load_config("/"); }), "/: is a directory; the experiment file must be a regular file");
  EXPECT_EQ(test::error_of([] { parse_config("rounds: 3\n---\nrounds: 4\n", "e.yaml"); }),
            "e.yaml: holds more than one YAML document (separated by '---', or a stray ',' at the top level); "
            "an experiment is one document");
  // yaml-cpp reads a lone ',' as endless empty documents: refused, not looped on (found by fuzz_config).
  EXPECT_EQ(test::error_of([] { parse_config(",\n", "e.yaml"); }),
            "e.yaml: holds more than one YAML document (separated by '---', or a stray ',' at the top level); "
            "an experiment is one document");
  EXPECT_NO_THROW(parse_config("", "e.yaml"));
  Config c;
  EXPECT_EQ(test::error_of([&] { apply_override(c, "rounds"); }), "--set rounds: expected dotted.key=value");
}

TEST(Config, RefusesDocumentsThatExpandBeyondTheNodeCap) {
  // Three levels of ten aliases: 10^3 leaves, fine; six levels: 10^6, refused without expanding them.
  auto bomb = [](int levels) {
    std::string text = "a0: &a0 {x0: 1, x1: 1, x2: 1, x3: 1, x4: 1, x5: 1, x6: 1, x7: 1, x8: 1, x9: 1}\n";
    for (int l = 1; l < levels; ++l) {
      text += fmt::format("a{}: &a{} {{", l, l);
      for (int i = 0; i < 10; ++i) text += fmt::format("{}k{}: *a{}", i ? ", " : "", i, l - 1);
      text += "}\n";
    }
    return text;
  };
  EXPECT_NO_THROW(parse_config(bomb(3), "small.yaml"));
  EXPECT_EQ(test::error_of([&] { parse_config(bomb(6), "bomb.yaml"); }),
            "bomb.yaml: the YAML expands to more than 100000 nodes (anchors and aliases repeat what they name); an "
            "experiment is a small mapping");
  const std::string deep = "rounds: " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  EXPECT_NE(test::error_of([&] { parse_config(deep, "deep.yaml"); }).find("deep.yaml"), std::string::npos);
}

TEST(Config, ResolvedYamlRoundTrips) {
  Config c = parse_config("algorithm:\n  client_lr: 0.25\nrounds: 7\n", "e.yaml");
  c.resolve(test_schema());
  const std::string yaml = config_to_yaml(c);
  EXPECT_NE(yaml.find("algorithm:\n  client_lr: 0.25"), std::string::npos) << yaml;
  Config again = parse_config(yaml, "resolved");
  again.resolve(test_schema());
  EXPECT_EQ(config_to_yaml(again), yaml);
  EXPECT_EQ(again.get_int("rounds"), 7);
  EXPECT_EQ(again.raw("algorithm.client_lr", "?"), "0.25");
}

TEST(Config, FloatsStayFloatsInYaml) {
  Schema s;
  s.add(float_key("x", "1.0", "x"));
  Config c;
  c.resolve(s);
  EXPECT_EQ(config_to_yaml(c), "x: 1.0\n");
}

TEST(Config, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("client_lr", "client_lrr"), 1u);
  EXPECT_EQ(describe_constraints(float_key("a", "1", "", 0, 1, true)), "in (0, 1]");
  EXPECT_EQ(describe_constraints(positive_float_key("a", "1", "")), "> 0");
  EXPECT_EQ(describe_constraints(bool_key("a", "true", "")), "");
}

}  // namespace
}  // namespace fax
