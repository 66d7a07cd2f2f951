// The per-run and per-worker series of GET /metrics, in the Prometheus text format
// (docs/OBSERVABILITY.md). Pure: renders from the runs' state at `now` (the engine's clock).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "core/clock.h"
#include "core/run.h"

namespace traincoord {

// The series of `runs`. At most `workers_per_run` workers of a run (the first by id) get their
// own series; the others are summed into worker="_other" (jobs) or take the largest age. A
// step-mode run adds its step and cost series (per set, and per rank capped the same way).
std::string metrics_text(std::span<const Run* const> runs, TimeMs now, size_t workers_per_run);

}  // namespace traincoord
