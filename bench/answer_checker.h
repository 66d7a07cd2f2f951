// The invariants of a coordinator's answers, as the load generator's workers see them (a fast
// wrong server must not score): no job handed out twice while a worker holds it, no batch of
// an epoch counted twice, every batch of a closed epoch counted once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace traincoord::bench {

// The answers' invariants, kept as the workers see them.
class AnswerChecker {
 public:
  explicit AnswerChecker(uint64_t batches_per_epoch) : batches_(batches_per_epoch) {}

  void handed(int64_t epoch, uint64_t index, uint64_t lease) {
    const uint64_t key = job_key(epoch, index);
    if (auto [it, fresh] = held_.emplace(key, lease); !fresh) {
      violations.push_back("job " + std::to_string(index) + " of epoch " + std::to_string(epoch) +
                           " handed out as lease " + std::to_string(lease) + " while lease " +
                           std::to_string(it->second) + " held it");
    }
  }
  void released(int64_t epoch, uint64_t index) { held_.erase(job_key(epoch, index)); }
  void counted(int64_t epoch, uint64_t batch) {
    auto& seen = counted_[epoch];
    if (seen.empty()) seen.assign(batches_, 0);
    if (batch >= batches_) {
      violations.push_back("batch " + std::to_string(batch) + " is outside the epoch");
      return;
    }
    if (++seen[batch] == 2) {
      violations.push_back("batch " + std::to_string(batch) + " of epoch " + std::to_string(epoch) +
                           " counted twice");
    }
    total_ += 1;
  }
  // Every epoch below the newest one the workers saw must have been counted whole: its jobs
  // were all handed out before the next epoch's, and every held job is completed at the end.
  // Returns how many epochs were checked.
  uint64_t check_closed_epochs() {
    if (counted_.empty()) return 0;
    int64_t newest = 0;
    for (const auto& [e, seen] : counted_) newest = std::max(newest, e);
    uint64_t checked = 0;
    for (auto& [e, seen] : counted_) {
      if (e >= newest) continue;  // (no lease expires here, so every older epoch is whole)
      for (uint64_t b = 0; b < batches_; ++b) {
        if (seen[b] != 1) {
          violations.push_back("batch " + std::to_string(b) + " of closed epoch " +
                               std::to_string(e) + " counted " + std::to_string(seen[b]) +
                               " times");
          break;
        }
      }
      checked += 1;
    }
    return checked;
  }
  uint64_t total_counted() const { return total_; }

  std::vector<std::string> violations;

 private:
  static uint64_t job_key(int64_t epoch, uint64_t index) {
    return (static_cast<uint64_t>(epoch) << 40) | index;
  }
  uint64_t batches_;
  std::unordered_map<uint64_t, uint64_t> held_;
  std::unordered_map<int64_t, std::vector<uint8_t>> counted_;
  uint64_t total_ = 0;
};

}  // namespace traincoord::bench
