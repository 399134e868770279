#include <fax/io/yaml.h>

#include <sstream>

#include <yaml-cpp/eventhandler.h>

#include <fax/base/error.h>

namespace fax {
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

// Parser events are not needed, only where documents begin.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

YAML::Node load_yaml(const std::string& text, const std::string& source) {
  size_t documents = 0;
  YAML::Node root;
  try {
    // yaml-cpp's LoadAll never ends on some inputs (a lone ',' reads as endless empty documents),
    // so documents are counted with a bounded walk and only the first is built.
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    DocumentCounter counter;
    while (documents < 2 && parser.HandleNextDocument(counter)) ++documents;
    if (documents == 1) root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) throw Error(fmt::format("{}: YAML syntax error: {}", source, e.msg));
    throw Error(fmt::format("{}:{}:{}: YAML syntax error: {}", source, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  FAX_CHECK(documents <= 1,
            "{}: holds more than one YAML document (separated by '---', or a stray ',' at the top "
            "level); an experiment is one document",
            source);
  if (documents == 0) return root;
  size_t budget = kMaxYamlNodes;
  FAX_CHECK(within_budget(root, budget),
            "{}: the YAML expands to more than {} nodes (anchors and aliases repeat what they name); an "
            "experiment is a small mapping",
            source, kMaxYamlNodes);
  return root;
}

}  // namespace fax
