#include <fax/spmd/client_states.h>

#include <ATen/ATen.h>

#include <fax/base/error.h>

namespace fax {

TensorTree ClientStates::gather(const ClientChunk& chunk, const TensorTree& initial) const {
  std::vector<TensorTree> rows;
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t i = 0; i < chunk.size; ++i) {
    const auto it = states_.find(chunk.client_id(i));
    TensorTree row;
    for (const auto& [name, t] : initial)
      row.set(name, it != states_.end() && it->second.contains(name) ? it->second.at(name) : t);
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return initial.map([](const at::Tensor& t) { return t.unsqueeze(0).narrow(0, 0, 0); });
  return stack(rows);
}

void ClientStates::scatter(const ClientChunk& chunk, const TensorTree& rows) {
  const auto per_client = unstack(detach(rows));
  FAX_ASSERT(static_cast<int64_t>(per_client.size()) == chunk.size, "{} state rows for a chunk of {}",
             per_client.size(), chunk.size);
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t i = 0; i < chunk.size; ++i) {
    TensorTree& state = states_[chunk.client_id(i)];
    for (const auto& [name, t] : per_client[i]) state.set(name, t.clone());
  }
}

size_t ClientStates::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return states_.size();
}

namespace {

// States in stacked() form: ids under "id", the states' leaves stacked in that order.
TensorTree stack_states(const std::vector<std::pair<int64_t, const TensorTree*>>& states) {
  if (states.empty()) return {};
  std::vector<int64_t> ids;
  std::vector<TensorTree> rows;
  for (const auto& [id, state] : states) {
    ids.push_back(id);
    rows.push_back(*state);
  }
  TensorTree out{{"id", at::tensor(ids, at::kLong)}};
  for (const auto& [name, t] : stack(rows)) out.set(name, t);
  return out;
}

}  // namespace

TensorTree ClientStates::stacked() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<int64_t, const TensorTree*>> all;
  for (const auto& [id, state] : states_) all.emplace_back(id, &state);
  return stack_states(all);
}

TensorTree ClientStates::subset(const std::vector<int64_t>& ids) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<int64_t, const TensorTree*>> some;
  for (int64_t id : ids) {
    const auto it = states_.find(id);
    if (it != states_.end()) some.emplace_back(id, &it->second);
  }
  return stack_states(some);
}

void ClientStates::restore(const TensorTree& stacked) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    states_.clear();
  }
  merge(stacked);
}

void ClientStates::merge(const TensorTree& stacked) {
  if (stacked.empty()) return;
  const at::Tensor ids = stacked.at("id");
  TensorTree leaves;
  for (const auto& [name, t] : stacked)
    if (name != "id") leaves.set(name, t);
  const auto rows = unstack(leaves);
  std::lock_guard<std::mutex> lock(mutex_);
  for (int64_t i = 0; i < ids.numel(); ++i) states_[ids[i].item<int64_t>()] = rows[i];
}

ClientStates::Saved ClientStates::save() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return states_;
}

void ClientStates::roll_back(Saved saved) {
  std::lock_guard<std::mutex> lock(mutex_);
  states_ = std::move(saved);
}

}  // namespace fax
