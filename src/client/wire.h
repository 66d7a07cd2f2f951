// What the C++ client writes on the wire, shared by its files (not part of the public API).
#pragma once

#include "json/json_writer.h"
#include "traincoord/client.h"

namespace traincoord::client::wire {

// One item of a "completions" list: {"lease": L, "loss": X, "samples": N, "metrics": {...}}.
inline void write_completion(JsonWriter& j, const Job& job, const Completion& c) {
  j.begin_object().field("lease", job.lease).field("loss", c.loss).field("samples", c.samples);
  if (!c.metrics.empty()) {
    j.key("metrics").begin_object();
    for (const auto& [name, value] : c.metrics) j.field(name, value);
    j.end_object();
  }
  j.end_object();
}

}  // namespace traincoord::client::wire
