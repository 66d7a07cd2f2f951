// Rebalancing (issue 20, docs/HA.md "Rebalancing"): which run, if any, a coordinator that leads
// more than its fair share of a prefix's runs hands over now, so that a coordinator that joined
// later gets some. Pure: the observations of etcd and the time come in, a decision goes out
// (serve_ha acts on it; tests/etcd/etcd_balance_test.cc simulates many coordinators with it).
//
// The rule (one coordinator's view, every observation of etcd):
// - the live coordinators (member keys) must have stayed the same for `settle_ms` (a newcomer
//   that kept its lease alive that long; a member that flaps moves nothing);
// - every run must have a leader (a run without one is being campaigned for: wait for it);
// - the run handed over last must be seen led by another coordinator (one hand-over at a time;
//   given up after four gaps or a change of members), and `gap_ms` must have passed since;
// - this coordinator leads more than its fair share, ceil(runs / live coordinators), and some
//   other live coordinator leads at least two runs fewer (implied by the first under one
//   consistent read, as observe() is: the loads sum to at most the runs; checked still). So a
//   move goes from a load of at least share+1 to one of at most share-1: the sum of the squared
//   loads falls with every move, and under a stable set of coordinators moves stop after
//   finitely many (no ping-pong);
// - the run handed over is one led here for at least `min_hold_ms`: of those, the one whose
//   takeover replays the fewest records (then by name).
// The campaign rule is EtcdRunElection::share's: a coordinator campaigns for a run with no leader
// only while it leads fewer than its fair share, so the coordinator that handed a run over
// (left with at least its share) does not take it back; one below its share does.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "journal/etcd_run_journal.h"

namespace traincoord {

struct BalancePolicy {
  int64_t settle_ms = 3000;    // the live coordinators unchanged this long
  int64_t min_hold_ms = 6000;  // a run led here for less is not handed over
  int64_t gap_ms = 3000;       // between two hand-overs of this coordinator
  // From --lease-ttl: settle and gap one TTL, the hold two.
  static BalancePolicy for_lease_ttl(int64_t ttl_s) {
    return {ttl_s * 1000, 2 * ttl_s * 1000, ttl_s * 1000};
  }
};

class Rebalancer {
 public:
  Rebalancer(std::string self, BalancePolicy policy) : self_(std::move(self)), policy_(policy) {}

  // One observation of etcd at `now_ms` (any monotonic clock); `led_since`: the runs this
  // coordinator serves as their leader, with when its leadership began. Returns the run to hand
  // over now, if any (the caller steps down from it and calls handed()).
  std::optional<std::string> decide(const RunsObservation& seen,
                                    const std::map<std::string, int64_t>& led_since,
                                    int64_t now_ms);
  // The caller handed `run` over at `now_ms`.
  void handed(const std::string& run, int64_t now_ms) {
    last_run_ = run;
    last_ms_ = now_ms;
    handovers_ += 1;
  }
  // (a hand-over is under way until its run is seen led by another, the members change, or
  // four gaps have passed)
  uint64_t handovers() const { return handovers_; }

 private:
  std::string self_;
  BalancePolicy policy_;
  std::vector<std::string> members_;  // as last seen, sorted
  int64_t members_since_ = 0;
  bool seen_once_ = false;
  std::optional<std::string> last_run_;
  int64_t last_ms_ = 0;
  uint64_t handovers_ = 0;
};

}  // namespace traincoord
