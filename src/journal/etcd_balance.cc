#include "journal/etcd_balance.h"

#include <algorithm>

namespace traincoord {

std::optional<std::string> Rebalancer::decide(const RunsObservation& seen,
                                              const std::map<std::string, int64_t>& led_since,
                                              int64_t now_ms) {
  std::vector<std::string> members = seen.member_urls;
  std::sort(members.begin(), members.end());
  if (!seen_once_ || members != members_) {
    members_ = members;
    members_since_ = now_ms;
    seen_once_ = true;
    last_run_.reset();  // (a hand-over under way is no one's to wait for now)
  }
  if (last_run_ && now_ms - last_ms_ >= 4 * policy_.gap_ms) last_run_.reset();
  if (last_run_) {
    for (const RunInEtcd& r : seen.runs) {
      if (r.run == *last_run_ && r.leader && *r.leader != self_) last_run_.reset();
    }
  }
  if (now_ms - members_since_ < policy_.settle_ms) return std::nullopt;
  if (!std::binary_search(members_.begin(), members_.end(), self_)) return std::nullopt;
  if (members_.size() < 2 || seen.runs.empty()) return std::nullopt;
  std::map<std::string, size_t> load;
  for (const std::string& m : members_) load[m] = 0;
  for (const RunInEtcd& r : seen.runs) {
    if (!r.leader) return std::nullopt;  // an election under way
    auto it = load.find(*r.leader);
    if (it != load.end()) it->second += 1;
  }
  if (last_run_ || (handovers_ > 0 && now_ms - last_ms_ < policy_.gap_ms)) return std::nullopt;
  const size_t mine = load[self_];
  const size_t share = (seen.runs.size() + members_.size() - 1) / members_.size();
  if (mine <= share) return std::nullopt;
  size_t least = mine;
  for (const auto& [member, n] : load) {
    if (member != self_) least = std::min(least, n);
  }
  if (least + 2 > mine) return std::nullopt;
  const RunInEtcd* pick = nullptr;
  for (const RunInEtcd& r : seen.runs) {
    if (*r.leader != self_) continue;
    auto since = led_since.find(r.run);
    if (since == led_since.end() || now_ms - since->second < policy_.min_hold_ms) continue;
    if (!pick || r.replay_records < pick->replay_records) pick = &r;  // (runs come by name)
  }
  if (!pick) return std::nullopt;
  return pick->run;
}

}  // namespace traincoord
