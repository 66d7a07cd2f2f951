#include "core/cost_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace traincoord {

namespace {

constexpr int kMaxIterations = 100;
// Ridge in the Jacobi-scaled normal equations (each diagonal entry ~1): small enough not to bias
// a well-determined fit, large enough to pick one solution where batches under one budget make
// the features nearly collinear (n·L² ≈ budget / c for every batch); predictions of batches like
// those reported are right either way.
constexpr double kRidge = 1e-7;

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Solves the rows and columns of `a` and `g` that `mask` selects (bit i: coefficient i), the
// others 0; false when the system is singular. Gaussian elimination with partial pivoting.
bool solve_subset(const std::array<std::array<double, 3>, 3>& a, const std::array<double, 3>& g,
                  int mask, std::array<double, 3>* out) {
  int index[3];
  int k = 0;
  for (int i = 0; i < 3; ++i) {
    if (mask & (1 << i)) index[k++] = i;
  }
  double m[3][4];
  for (int i = 0; i < k; ++i) {
    for (int j = 0; j < k; ++j) m[i][j] = a[index[i]][index[j]];
    m[i][3] = g[index[i]];
  }
  for (int col = 0; col < k; ++col) {
    int pivot = col;
    for (int row = col + 1; row < k; ++row) {
      if (std::abs(m[row][col]) > std::abs(m[pivot][col])) pivot = row;
    }
    for (int j = 0; j < 4; ++j) std::swap(m[col][j], m[pivot][j]);
    if (m[col][col] == 0) return false;
    for (int row = col + 1; row < k; ++row) {
      const double f = m[row][col] / m[col][col];
      for (int j = col; j < 4; ++j) m[row][j] -= f * m[col][j];
    }
  }
  *out = {};
  for (int i = k - 1; i >= 0; --i) {
    double v = m[i][3];
    for (int j = i + 1; j < k; ++j) v -= m[i][j] * (*out)[index[j]];
    (*out)[index[i]] = v / m[i][i];
  }
  return true;
}

// The least-squares θ ≥ 0 of the normal equations a·θ = g: a cost is never negative, and a
// negative coefficient fitted from noise would make a planner's predictions of other shapes
// negative. With three coefficients, every subset of them is tried (the active-set solution is
// one of the 7) and the feasible one with the least squared error, θᵀaθ − 2gᵀθ, wins.
std::array<double, 3> nonnegative_solution(const std::array<std::array<double, 3>, 3>& a,
                                           const std::array<double, 3>& g) {
  std::array<double, 3> best{};
  double best_error = 0;  // θ = 0
  for (int mask = 1; mask < 8; ++mask) {
    std::array<double, 3> t;
    if (!solve_subset(a, g, mask, &t)) continue;
    if (t[0] < 0 || t[1] < 0 || t[2] < 0) continue;
    double error = 0;
    for (int i = 0; i < 3; ++i) {
      error -= 2 * g[i] * t[i];
      for (int j = 0; j < 3; ++j) error += t[i] * a[i][j] * t[j];
    }
    if (error < best_error) {
      best = t;
      best_error = error;
    }
  }
  return best;
}

}  // namespace

std::string BatchCost::describe() const {
  return "a " + number(a) + " + b " + number(b) + " + c " + number(c);
}

CostModel::CostModel(uint32_t ranks, CostModelOptions options)
    : options_(options), ranks_(ranks), speed_(ranks, 1.0), reference_speed_(ranks, 1.0) {
  TC_ASSERT(ranks >= 1);
}

bool CostModel::report(uint32_t rank, const BatchShape& shape, double seconds) {
  TC_ASSERT(rank < ranks_.size());
  if (shape.samples == 0 || !std::isfinite(seconds) || seconds <= 0 ||
      !std::isfinite(shape.longest) || shape.longest < 0) {
    return false;
  }
  const double n = static_cast<double>(shape.samples);
  const Vec x = {1.0, n * shape.longest, n * shape.longest * shape.longest};
  // Relative errors: each report weighs 1 / time². Once fitted, the time is the prediction's,
  // and a report off it by more than `huber` (relative) is weighed down by huber / error: a
  // report far too long (a pause) or far too short (a timer read early) pulls no more than one
  // at the edge would.
  double w = 1.0 / (seconds * seconds);
  // The reference fit for outliers is refreshed at reports 8, 16, 32, 64, then every 64: O(1)
  // amortised per report, and the same reports always give the same weights.
  if (fitted()) {
    const bool refresh = reports_ < 64 ? std::has_single_bit(reports_) : reports_ % 64 == 0;
    if (refresh) solve(&reference_theta_, &reference_speed_);
    const bool unproven = options_.judge_first_reports_at_speed_1 &&
                          ranks_[rank].count < options_.min_reports_per_rank;
    const double predicted =
        (unproven ? 1.0 : reference_speed_[rank]) *
        (reference_theta_[0] * x[0] + reference_theta_[1] * x[1] + reference_theta_[2] * x[2]);
    if (predicted > 0) {
      w = 1.0 / (predicted * predicted);
      const double error = std::abs(seconds / predicted - 1.0);
      if (error > options_.huber) w *= options_.huber / error;
    }
  }
  RankSums& s = ranks_[rank];
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) s.xx[i][j] += w * x[i] * x[j];
    s.xy[i] += w * x[i] * seconds;
  }
  ++s.count;
  ++reports_;
  dirty_ = true;
  return true;
}

bool CostModel::fitted_for_every_rank() const {
  if (!fitted()) return false;
  for (const RankSums& r : ranks_) {
    if (r.count < options_.min_reports_per_rank) return false;
  }
  return true;
}

void CostModel::fit() const {
  dirty_ = false;
  std::vector<double> s;
  solve(&theta_, &s);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    speed_[r] = ranks_[r].count >= options_.min_reports_per_rank ? s[r] : 1.0;
  }
}

void CostModel::solve(Vec* theta_out, std::vector<double>* speed_out) const {
  *theta_out = {};
  speed_out->assign(ranks_.size(), 1.0);
  if (reports_ == 0) return;
  // Jacobi scaling: the features differ by orders of magnitude (1, n·L, n·L²).
  Vec scale{};
  for (const RankSums& r : ranks_) {
    for (int i = 0; i < 3; ++i) scale[i] += r.xx[i][i];
  }
  for (double& d : scale) d = d > 0 ? std::sqrt(d) : 1.0;

  // The prior: a penalty on θ's part off the declared shape's line, μ·|θ − (θ·d)d|² in scaled
  // coordinates (d the unit vector of the declared shape there), so its scale is left to the
  // reports. Each report adds about 1/reports to each scaled diagonal entry (it is 1 in all), so
  // μ = prior_reports / reports weighs the shape as that many reports.
  Mat prior{};
  {
    const BatchCost& p = options_.prior;
    // (divided by its largest coefficient first: a shape, whose squares must neither
    // underflow nor overflow)
    const double top = std::max({p.a, p.b, p.c});
    const double k = top > 0 && std::isfinite(top) ? 1 / top : 0;
    const Vec d0 = {p.a * k * scale[0], p.b * k * scale[1], p.c * k * scale[2]};
    const double norm = std::sqrt(d0[0] * d0[0] + d0[1] * d0[1] + d0[2] * d0[2]);
    if (norm > 0 && std::isfinite(norm) && p.a >= 0 && p.b >= 0 && p.c >= 0) {
      const double mu = options_.prior_reports / static_cast<double>(reports_);
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j)
          prior[i][j] = mu * ((i == j ? 1.0 : 0.0) - d0[i] * d0[j] / (norm * norm));
      }
    }
  }

  std::vector<double> s(ranks_.size(), 1.0);
  for (int iteration = 0; iteration < kMaxIterations; ++iteration) {
    // θ given the speeds: (Σ s²·XX + ridge) θ = Σ s·XY, in scaled coordinates.
    Mat a{};
    Vec g{};
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r].count == 0) continue;
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j)
          a[i][j] += s[r] * s[r] * ranks_[r].xx[i][j] / (scale[i] * scale[j]);
        g[i] += s[r] * ranks_[r].xy[i] / scale[i];
      }
    }
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) a[i][j] += prior[i][j];
      a[i][i] += kRidge;
    }
    const Vec t = nonnegative_solution(a, g);
    Vec theta{};
    for (int i = 0; i < 3; ++i) theta[i] = t[i] / scale[i];
    // The speeds given θ: s_r = θ·XY_r / θᵀ·XX_r·θ, each rank's least-squares factor.
    double change = 0;
    std::vector<double> next(ranks_.size(), 1.0);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const RankSums& rs = ranks_[r];
      if (rs.count == 0) continue;
      double num = 0, den = 0;
      for (int i = 0; i < 3; ++i) {
        num += theta[i] * rs.xy[i];
        for (int j = 0; j < 3; ++j) den += theta[i] * rs.xx[i][j] * theta[j];
      }
      if (den > 0 && num > 0) next[r] = num / den;
    }
    // Normalise: the fastest rank with enough reports has speed 1.
    double fastest = 0;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r].count >= options_.min_reports_per_rank && (fastest == 0 || next[r] < fastest)) {
        fastest = next[r];
      }
    }
    if (fastest <= 0) fastest = 1;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      next[r] /= fastest;
      change = std::max(change, std::abs(next[r] - s[r]));
    }
    for (double& v : theta) v *= fastest;
    s = next;
    *theta_out = theta;
    *speed_out = s;
    if (change < 1e-12) break;
  }
}

BatchCost CostModel::shared() const {
  if (!fitted()) return {0, 0, 0};
  if (dirty_) fit();
  return {theta_[0], theta_[1], theta_[2]};
}

double CostModel::speed(uint32_t rank) const {
  TC_ASSERT(rank < ranks_.size());
  if (!fitted()) return 1.0;
  if (dirty_) fit();
  return speed_[rank];
}

std::vector<double> CostModel::speeds() const {
  std::vector<double> v;
  for (uint32_t r = 0; r < ranks(); ++r) v.push_back(speed(r));
  return v;
}

double CostModel::predict(uint32_t rank, const BatchShape& shape) const {
  if (!fitted()) return 0;
  return speed(rank) * shared().padded(shape);
}

}  // namespace traincoord
