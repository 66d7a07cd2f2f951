// An HDR-style latency histogram: log-linear buckets (each power of two split into 128 linear
// sub-buckets), so any recorded value is reported within 1/128 (< 0.8%) of itself, from 1 ns
// to ~2,000 s, in a fixed 35 KiB. Written here because Debian ships no C/C++ HdrHistogram; this is
// the same bucketing, without its serialisation formats.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace traincoord::bench {

class LatencyHistogram {
 public:
  static constexpr int kSubBits = 7;  // 128 sub-buckets per power of two
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kMagnitudes = 34;  // up to 2^(34+8) ns, far past any timeout

  void record(uint64_t ns) {
    counts_[index(ns)] += 1;
    total_ += 1;
    max_ = std::max(max_, ns);
  }

  void merge(const LatencyHistogram& other) {
    for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
    total_ += other.total_;
    max_ = std::max(max_, other.max_);
  }

  uint64_t count() const { return total_; }
  uint64_t max() const { return max_; }

  // The value at quantile q (0..1): the upper edge of the bucket it falls in, capped at max().
  uint64_t quantile(double q) const {
    if (total_ == 0) return 0;
    const auto rank = static_cast<uint64_t>(q * static_cast<double>(total_ - 1)) + 1;
    uint64_t seen = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen >= rank) return std::min(upper_edge(i), max_);
    }
    return max_;
  }

 private:
  // Values below 2^kSubBits get exact buckets; above, the shift that leaves 8 significant bits
  // picks the magnitude, and the 7 bits after the leading one the sub-bucket.
  static size_t index(uint64_t v) {
    if (v < kSub) return static_cast<size_t>(v);
    const int shift = std::bit_width(v) - (kSubBits + 1);
    if (shift >= kMagnitudes) return kSub + kMagnitudes * kSub - 1;
    const uint64_t sub = (v >> shift) - kSub;
    return static_cast<size_t>(kSub + shift * kSub) + static_cast<size_t>(sub);
  }
  static uint64_t upper_edge(size_t i) {
    if (i < static_cast<size_t>(kSub)) return i;
    const size_t k = i - kSub;
    const size_t shift = k / kSub;
    const uint64_t sub = k % kSub;
    return ((kSub + sub + 1) << shift) - 1;
  }

  std::array<uint64_t, kSub + kMagnitudes * kSub> counts_{};
  uint64_t total_ = 0;
  uint64_t max_ = 0;
};

}  // namespace traincoord::bench
