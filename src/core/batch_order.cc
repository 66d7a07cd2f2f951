#include "core/batch_order.h"

namespace traincoord {

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser: a strong 64-bit mixer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr int kRounds = 4;

}  // namespace

EpochOrder::EpochOrder(BatchOrder order, uint64_t batches, uint64_t seed, int64_t epoch,
                       SetKind set)
    : sequential_(order == BatchOrder::kSequential || batches <= 1),
      batches_(batches),
      key_(mix64(mix64(seed) ^
                 mix64(static_cast<uint64_t>(epoch) * 2 + static_cast<uint64_t>(set)))),
      half_bits_(1) {
  while ((uint64_t{1} << (2 * half_bits_)) < batches_) ++half_bits_;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t EpochOrder::feistel(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t f = mix64(key_ ^ (right * kRounds + static_cast<uint64_t>(round))) & half_mask_;
    const uint64_t next_right = left ^ f;
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

uint64_t EpochOrder::batch_at(uint64_t position) const {
  TC_ASSERT(position < batches_);
  if (sequential_) return position;
  // A Feistel network permutes [0, 4^half_bits); cycle-walking restricts it to [0, batches)
  // and stays a bijection. The domain is under 4x the set, so a walk averages < 4 steps.
  uint64_t x = feistel(position);
  while (x >= batches_) x = feistel(x);
  return x;
}

}  // namespace traincoord
