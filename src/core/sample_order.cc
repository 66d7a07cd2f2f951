#include "core/sample_order.h"

#include <bit>

#include "core/error.h"

namespace traincoord {

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser, as in batch_order.cc
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr uint64_t kTag = 0x73616d706c657321ULL;  // "samples!": independent of the batch order
constexpr std::array<uint64_t, 4> kMultipliers = {0xbf58476d1ce4e5b9ULL, 0x94d049bb133111ebULL,
                                                  0xd6e8feb86659fd93ULL, 0x9e3779b97f4a7c15ULL};

}  // namespace

SampleOrder::SampleOrder(uint64_t samples, uint64_t batch_size, uint64_t seed, SetKind set,
                         SampleShuffle shuffle)
    : samples_(samples), batch_size_(batch_size), seed_(seed), set_(set), shuffle_(shuffle) {
  TC_ASSERT(batch_size >= 1);
  const int bits = samples <= 1 ? 0 : std::bit_width(samples - 1);
  mask_ = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  shift_ = std::max(1, (bits + 1) / 2);
}

SampleOrder::Keys SampleOrder::round_keys(int64_t epoch) const {
  if (shuffle_ == SampleShuffle::kFixed) epoch = 0;
  const uint64_t key = mix64(mix64(seed_ ^ kTag) ^
                             mix64(static_cast<uint64_t>(epoch) * 2 + static_cast<uint64_t>(set_)));
  Keys keys;
  for (size_t r = 0; r < keys.size(); ++r) keys[r] = mix64(key + r) & mask_;
  return keys;
}

uint64_t SampleOrder::permute(const Keys& keys, uint64_t x) const {
  // Each round (xor a key, multiply by an odd constant, xorshift right, all modulo 2^k) is a
  // bijection of [0, 2^k): the low k bits of a product depend only on the low k bits of its
  // factors. Cycle walking restricts it to [0, samples); 2^k < 2 * samples, so a walk
  // averages under two steps.
  do {
    for (size_t r = 0; r < keys.size(); ++r) {
      x = ((x ^ keys[r]) * kMultipliers[r]) & mask_;
      x ^= x >> shift_;
    }
  } while (x >= samples_);
  return x;
}

uint64_t SampleOrder::at(int64_t epoch, uint64_t position) const {
  TC_ASSERT(position < samples_);
  if (shuffle_ == SampleShuffle::kNone) return position;
  return permute(round_keys(epoch), position);
}

void SampleOrder::at_each(int64_t epoch, std::span<const uint64_t> positions,
                          std::vector<uint64_t>* out) const {
  if (shuffle_ == SampleShuffle::kNone) {
    for (uint64_t p : positions) {
      TC_ASSERT(p < samples_);
      out->push_back(p);
    }
    return;
  }
  const Keys keys = round_keys(epoch);
  for (uint64_t p : positions) {
    TC_ASSERT(p < samples_);
    out->push_back(permute(keys, p));
  }
}

void SampleOrder::batch(int64_t epoch, uint64_t batch, std::vector<uint64_t>* out) const {
  TC_ASSERT(batch < batches());
  const uint64_t begin = batch * batch_size_;
  const uint64_t end = std::min(samples_, begin + batch_size_);
  if (shuffle_ == SampleShuffle::kNone) {
    for (uint64_t p = begin; p < end; ++p) out->push_back(p);
    return;
  }
  const Keys keys = round_keys(epoch);
  for (uint64_t p = begin; p < end; ++p) out->push_back(permute(keys, p));
}

}  // namespace traincoord
