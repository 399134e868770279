#include "yaml_load.h"

#include <fax/error.h>

namespace fax::detail {
namespace {

// Counts nodes the way a reader walking the document meets them (an alias as often as it is
// used), giving up as soon as the budget is spent, so the walk itself is bounded.
bool within_budget(const YAML::Node& node, size_t& budget) {
  if (budget == 0) return false;
  --budget;
  if (node.IsMap()) {
    for (const auto& item : node)
      if (!within_budget(item.first, budget) || !within_budget(item.second, budget)) return false;
  } else if (node.IsSequence()) {
    for (const auto& item : node)
      if (!within_budget(item, budget)) return false;
  }
  return true;
}

}  // namespace

YAML::Node load_yaml(const std::string& text, const std::string& source) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) throw Error(fmt::format("{}: YAML syntax error: {}", source, e.msg));
    throw Error(fmt::format("{}:{}:{}: YAML syntax error: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  FAX_CHECK(documents.size() <= 1,
            "{}: holds {} YAML documents (separated by '---'); an experiment is one document", source,
            documents.size());
  if (documents.empty()) return YAML::Node();
  size_t budget = kMaxYamlNodes;
  FAX_CHECK(within_budget(documents.front(), budget),
            "{}: the YAML expands to more than {} nodes (anchors and aliases repeat what they name); an "
            "experiment is a small mapping",
            source, kMaxYamlNodes);
  return documents.front();
}

}  // namespace fax::detail
