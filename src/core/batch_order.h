// The order in which an epoch visits the batches of a set: sequential, or a seeded permutation
// that is computed on demand (O(1) memory, also for 10^9 batches).
#pragma once

#include <cstdint>

#include "core/plan.h"
#include "core/run_config.h"

namespace traincoord {

class EpochOrder {
 public:
  // The order of epoch `epoch` of a set of `batches` batches. The same (seed, epoch, set)
  // always gives the same order; different epochs give independent orders.
  EpochOrder(BatchOrder order, uint64_t batches, uint64_t seed, int64_t epoch, SetKind set);

  // The batch index at position `position` of the epoch. REQUIRES: position < batches.
  uint64_t batch_at(uint64_t position) const;

  bool sequential() const { return sequential_; }
  uint64_t batches() const { return batches_; }

 private:
  uint64_t feistel(uint64_t x) const;

  bool sequential_;
  uint64_t batches_;
  uint64_t key_;
  int half_bits_;  // the permuted domain is [0, 2^(2*half_bits))
  uint64_t half_mask_;
};

}  // namespace traincoord
