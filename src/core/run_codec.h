// Saving and restoring the whole state of a run as bytes: the snapshots of the durable store.
// Pure: bytes in, bytes out.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/clock.h"
#include "core/error.h"
#include "core/run.h"
#include "core/run_config.h"

namespace traincoord {

class RunCodec {
 public:
  // The run's state (everything but its config and recent events) as bytes.
  static std::string save(const Run& run);
  // The same, with every worker's "last seen" time as 0: the state the journal rebuilds
  // exactly (it keeps what changed state, not every time a worker was seen; docs/DURABILITY.md).
  static std::string save_journalled(const Run& run) { return save(run, false); }
  static std::string save(const Run& run, bool last_seen);

  // A run with `config` (the one it was saved with) and the saved state. Fails with
  // kInvalidArgument when the bytes are truncated, corrupt, or of another format version, or
  // when the state they hold breaks an invariant of Run (a lease of an unknown worker or job, a
  // count that disagrees with what it counts, a value outside its enum): a damaged snapshot is
  // an error that says so, never a run that crashes later.
  //
  // Paired assertions (as TigerBeetle pairs its codecs): save() asserts of the run it saves
  // the same invariants that load() checks of what it reads, and in builds without NDEBUG that
  // the bytes load back to a run that saves the same bytes.
  static Result<std::unique_ptr<Run>> load(RunConfig config, std::string_view bytes,
                                           const Clock& clock);

  // What format 10 added before the mode (the last byte of what save() writes): each worker's
  // samples done, the run's series (core/run_series.h). An older snapshot has none of them.
  static std::string format10_bytes(const Run& run);
  // What format 11 added at the end (after the mode): each epoch's warm-up re-plan, the run's
  // then each cut's (one byte 0 per epoch not re-planned).
  static std::string format11_bytes(const Run& run);

 private:
  static std::string encode(const Run& run, bool last_seen);
  // What invariant of Run `run` breaks, or empty when it keeps them all.
  static std::string inconsistency(const Run& run);
};

}  // namespace traincoord
