// What a JobStream (traincoord/client.h) asks the coordinator for in its next round trip,
// decided from what the stream knows under its lock. Pure, so that the rules are tested without
// a thread race (job_stream_test.cc).
#pragma once

#include <algorithm>
#include <cstddef>

namespace traincoord::client {

struct StreamState {
  size_t depth = 1;        // jobs to keep fetched ahead
  size_t ready = 0;        // jobs fetched, not yet taken by next()
  size_t completions = 0;  // completions queued to send
  bool waiting = false;    // the caller is blocked in next() ...
  bool dry = false;        // the last acquire found no job right now
  bool stopping = false;   // closing, or the run finished: only completions are sent
};

struct StreamRound {
  size_t jobs = 0;         // jobs to ask for (0: none)
  bool long_poll = false;  // wait at the coordinator until a job comes
  bool any() const { return jobs > 0; }
};

// The caller is starved when it waits in next() with nothing ready. `waiting` alone is not
// enough: it stays true from the moment a job is delivered until the caller's thread runs
// again, and a stream that read it as "starved" then asked for one more job, round after
// round, took a whole epoch's jobs on a busy machine and long-polled while the caller's
// completions of them queued behind the poll (the epoch barrier then waited for the leases to
// expire: 20-40 s stalls).
inline bool starved(const StreamState& s) { return s.waiting && s.ready == 0; }

inline bool has_work(const StreamState& s) {
  if (s.completions > 0) return true;
  if (s.stopping) return false;
  return starved(s) || (!s.dry && s.ready < s.depth);
}

// REQUIRES: `completions` is what this round sends (at most a batch of them).
inline StreamRound plan_round(const StreamState& s) {
  if (s.stopping) return {};
  size_t jobs = s.depth - std::min(s.depth, s.ready);
  if (starved(s)) jobs = std::max<size_t>(jobs, 1);
  if (s.dry && !starved(s)) jobs = 0;  // nothing open now: ask again when the caller needs it
  // Only a starved caller is worth a long poll, and never one with completions to send: the
  // caller cannot queue any while it waits, and what is queued may be what the coordinator
  // waits for to open the next epoch.
  return {jobs, jobs > 0 && starved(s) && s.completions == 0};
}

}  // namespace traincoord::client
