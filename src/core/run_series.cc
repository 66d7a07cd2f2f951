#include "core/run_series.h"

#include <algorithm>
#include <cmath>

namespace traincoord {

void Series::add(uint64_t n, int64_t epoch, double value) {
  if (!std::isfinite(value)) return;
  const SeriesPoint p{n, epoch, value};
  // Values 1, 1 + stride, ... are kept: value count_ + 1 is one of them when count_ % stride
  // is 0 (the stride is a power of 2: a mask, not a division, on every completion).
  if ((count_ & (stride_ - 1)) == 0) {
    if (kept_.size() == kCapacity) {
      // Every other point goes (those at odd places), and the stride doubles: what is left are
      // values 1, 1 + 2·stride, ... as if the stride had been doubled from the start.
      size_t w = 0;
      for (size_t r = 0; r < kept_.size(); r += 2) kept_[w++] = kept_[r];
      kept_.resize(w);
      stride_ *= 2;
    }
    if ((count_ & (stride_ - 1)) == 0) kept_.push_back(p);
  }
  count_ += 1;
  latest_ = p;
}

std::vector<SeriesPoint> Series::points() const {
  std::vector<SeriesPoint> out = kept_;
  if (auto latest = latest_unkept()) out.push_back(*latest);
  return out;
}

std::vector<SeriesPoint> Series::kept_after(uint64_t after) const {
  auto first = std::upper_bound(kept_.begin(), kept_.end(), after,
                                [](uint64_t n, const SeriesPoint& p) { return n < p.n; });
  return std::vector<SeriesPoint>(first, kept_.end());
}

std::optional<SeriesPoint> Series::latest_unkept() const {
  if (!latest_ || (!kept_.empty() && kept_.back().n == latest_->n)) return std::nullopt;
  return latest_;
}

std::string Series::consistent(const std::vector<SeriesPoint>& kept,
                               const std::optional<SeriesPoint>& latest, uint64_t stride,
                               uint64_t count) {
  if (stride == 0 || (stride & (stride - 1)) != 0) return "a stride that is not a power of 2";
  if (kept.size() > kCapacity) return "more points than a series keeps";
  // count values at stride s keep ceil(count / s) points.
  if (kept.size() != (count + stride - 1) / stride) return "points that disagree with the count";
  if (count > 0 && !latest) return "no latest value";
  if (count == 0 && latest) return "a latest value of no value";
  for (size_t i = 1; i < kept.size(); ++i) {
    if (kept[i].n <= kept[i - 1].n) return "points out of order";
  }
  if (latest && !kept.empty() && latest->n < kept.back().n) return "a latest value before a point";
  return {};
}

Series Series::restored(std::vector<SeriesPoint> kept, std::optional<SeriesPoint> latest,
                        uint64_t stride, uint64_t count) {
  Series s;
  s.kept_ = std::move(kept);
  s.latest_ = latest;
  s.stride_ = stride;
  s.count_ = count;
  return s;
}

Series* RunSeries::find_or_add(SetKind set, const std::string& name) {
  auto it = series_.find(Key{set, name});
  if (it != series_.end()) return &it->second;
  size_t& names = names_[static_cast<int>(set)];
  if (names == kMaxNames) {
    dropped_names_ += 1;
    return nullptr;
  }
  names += 1;
  return &series_.emplace(Key{set, name}, Series{}).first->second;
}

std::string RunSeries::consistent(const std::map<Key, Series>& series) {
  size_t names[2] = {0, 0};
  for (const auto& [key, s] : series) {
    if (key.first != SetKind::kTrain && key.first != SetKind::kDev) return "a series of no set";
    if (++names[static_cast<int>(key.first)] > kMaxNames) return "more series than a set keeps";
  }
  return {};
}

RunSeries RunSeries::restored(std::map<Key, Series> series, uint64_t dropped_names) {
  RunSeries r;
  for (const auto& [key, s] : series) r.names_[static_cast<int>(key.first)] += 1;
  r.series_ = std::move(series);
  r.dropped_names_ = dropped_names;
  return r;
}

void RunSeries::add(SetKind set, int64_t epoch, uint64_t n, const Completion& c) {
  Series*& loss = loss_[static_cast<int>(set)];
  if (!loss) loss = find_or_add(set, "loss");
  if (loss) loss->add(n, epoch, c.loss);
  for (const Metric& m : c.metrics) {
    if (m.name == "loss") continue;  // (the loss is its own series)
    if (Series* s = find_or_add(set, m.name)) s->add(n, epoch, m.value);
  }
}

}  // namespace traincoord
