// Which samples make up a batch: a keyed permutation of a set's samples, computed on demand
// (O(1) memory per epoch), the same in the C++ and Python clients (python/traincoord/order.py;
// tests/vectors/sample_order.json pins both).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/plan.h"

namespace traincoord {

enum class SampleShuffle : uint8_t {
  kEpoch,  // a fresh permutation of the samples every epoch (DistributedSampler.set_epoch)
  kFixed,  // one permutation for the whole run: batch membership never changes
  kNone,   // batch b holds the samples [b * batch_size, (b + 1) * batch_size) as they are
};

class SampleOrder {
 public:
  // REQUIRES: batch_size >= 1.
  SampleOrder(uint64_t samples, uint64_t batch_size, uint64_t seed, SetKind set,
              SampleShuffle shuffle);

  uint64_t samples() const { return samples_; }
  uint64_t batches() const { return (samples_ + batch_size_ - 1) / batch_size_; }

  // The sample at position `position` of epoch `epoch`'s order. REQUIRES: position < samples.
  uint64_t at(int64_t epoch, uint64_t position) const;
  // Appends at(epoch, p) for each p of `positions` to `out` (the epoch's keys derived once).
  void at_each(int64_t epoch, std::span<const uint64_t> positions,
               std::vector<uint64_t>* out) const;
  // Appends the samples of batch `batch` of epoch `epoch` to `out`. REQUIRES: batch < batches().
  void batch(int64_t epoch, uint64_t batch, std::vector<uint64_t>* out) const;

 private:
  using Keys = std::array<uint64_t, 4>;
  Keys round_keys(int64_t epoch) const;
  uint64_t permute(const Keys& keys, uint64_t x) const;

  uint64_t samples_;
  uint64_t batch_size_;
  uint64_t seed_;
  SetKind set_;
  SampleShuffle shuffle_;
  uint64_t mask_;  // the permuted domain is [0, mask_ + 1), under twice the samples
  int shift_;
};

}  // namespace traincoord
