// The engine: many independent runs (a hyperparameter sweep, say), each with its own config,
// behind one clock. Single-threaded; the network layer hands it requests one at a time.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "core/run.h"
#include "core/run_config.h"

namespace traincoord {

class Engine {
 public:
  // REQUIRES: `clock` outlives the engine.
  explicit Engine(const Clock& clock) : clock_(clock) {}

  // Creates a run. Fails with kInvalidArgument (naming the field) for a bad config, and with
  // kConflict when a run of that name exists.
  Result<Run*> create_run(RunConfig config);
  // Adds a run restored from a snapshot, replacing any run of the same name.
  void adopt(std::unique_ptr<Run> run);
  // Returns the run, or kNotFound.
  Result<Run*> find(std::string_view name);
  Result<const Run*> find(std::string_view name) const;
  // Cancels the run; nothing more is handed out. kNotFound for an unknown run.
  Result<void> cancel_run(const std::string& name, std::string reason);
  // Every run, by name.
  std::vector<const Run*> runs() const;

  const Clock& clock() const { return clock_; }

 private:
  const Clock& clock_;
  std::map<std::string, std::unique_ptr<Run>, std::less<>> runs_;
};

}  // namespace traincoord
