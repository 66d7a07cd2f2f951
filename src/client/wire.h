// What the C++ client writes on the wire, shared by its files (not part of the public API).
#pragma once

#include "json/json_writer.h"
#include "traincoord/client.h"

namespace traincoord::client::wire {

// Opens the body of a worker's request: {"worker": W, and "group": G when it has one. The caller
// writes the rest and closes the object.
inline JsonWriter& begin_request(JsonWriter& j, uint32_t worker, const std::string& group) {
  j.begin_object().field("worker", worker);
  if (!group.empty()) j.field("group", group);
  return j;
}

// One item of a "completions" list: {"lease": L, "loss": X, "samples": N, "metrics": {...}}.
inline void write_completion(JsonWriter& j, const Job& job, const Completion& c) {
  j.begin_object().field("lease", job.lease).field("loss", c.loss).field("samples", c.samples);
  if (c.seconds) j.field("seconds", *c.seconds);
  if (!c.metrics.empty()) {
    j.key("metrics").begin_object();
    for (const auto& [name, value] : c.metrics) j.field(name, value);
    j.end_object();
  }
  j.end_object();
}

}  // namespace traincoord::client::wire
