#include "core/engine.h"

namespace traincoord {

Result<Run*> Engine::create_run(RunConfig config) {
  if (auto ok = validate(config); !ok) return tl::unexpected(ok.error());
  if (runs_.count(config.name) != 0) {
    return conflict("a run named " + config.name + " exists already; pick another name",
                    error_reason::kRunExists);
  }
  std::string name = config.name;
  auto run = std::make_unique<Run>(std::move(config), clock_);
  Run* raw = run.get();
  runs_.emplace(std::move(name), std::move(run));
  return raw;
}

void Engine::adopt(std::unique_ptr<Run> run) {
  std::string name = run->config().name;
  runs_[std::move(name)] = std::move(run);
}

Result<Run*> Engine::find(std::string_view name) {
  auto it = runs_.find(name);
  if (it == runs_.end()) {
    return not_found("no run named " + std::string(name), error_reason::kRunNotFound);
  }
  return it->second.get();
}

Result<const Run*> Engine::find(std::string_view name) const {
  auto it = runs_.find(name);
  if (it == runs_.end()) {
    return not_found("no run named " + std::string(name), error_reason::kRunNotFound);
  }
  return it->second.get();
}

Result<void> Engine::cancel_run(const std::string& name, std::string reason) {
  auto run = find(name);
  if (!run) return tl::unexpected(run.error());
  (*run)->cancel(std::move(reason));
  return {};
}

std::vector<const Run*> Engine::runs() const {
  std::vector<const Run*> out;
  out.reserve(runs_.size());
  for (const auto& [name, run] : runs_) out.push_back(run.get());
  return out;
}

}  // namespace traincoord
