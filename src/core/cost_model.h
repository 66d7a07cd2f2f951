// What a batch costs: the shape of a padded batch's cost, and a per-rank model of batch times
// fitted from the times ranks report (issue 32). Pure and deterministic: the same reports in the
// same order give the same model, bit for bit.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace traincoord {

// A padded batch: `samples` samples, each padded to the length of the longest, `longest`.
struct BatchShape {
  uint64_t samples = 0;
  double longest = 0;
};

// The cost of a padded batch: a + b·n·L + c·n·L², with n its samples and L its longest length.
// The model is per *padded* batch, not per sample (a + b·Σlen + c·Σlen²), because an accelerator
// computes on the padded tensor: its shape (n, L) is what takes time (b: the work linear in the
// padded tokens, c: attention-like work quadratic in the padded length, a: the per-batch
// overhead). A per-sample model would count the padding as free and under-predict exactly the
// batches that pad most. The cost of one sample alone, unpadded, is b·len + c·len² (sample()).
struct BatchCost {
  double a = 0;
  double b = 0;
  double c = 1;

  double padded(const BatchShape& shape) const {
    const double n = static_cast<double>(shape.samples);
    return shape.samples == 0 ? 0 : a + n * (b * shape.longest + c * shape.longest * shape.longest);
  }
  // What one sample of length `length` costs without padding and without the batch overhead.
  double sample(double length) const { return b * length + c * length * length; }
  std::string describe() const;  // "a 0.5 + b 1 + c 0.05"
};

struct CostModelOptions {
  // Reports a rank gives before its speed factor is estimated (until then its factor is 1).
  uint64_t min_reports_per_rank = 3;
  // Reports in all before the model is fitted (before that, fitted() is false).
  uint64_t min_reports = 8;
  // Huber-like robustness: once fitted, a report whose time is off the prediction by more than
  // this relative error is weighted down by huber / |error| (a garbage-collection pause, a
  // checkpoint written inside a step), so one outlier cannot drag the model.
  double huber = 0.25;
  // The declared cost, whose shape (a : b : c; the scale is the reports') the fit keeps in what
  // the reports cannot tell apart. Batches planned under one budget all take about the same
  // time, and from those alone "a per-batch constant" fits as well as the true shape: a real
  // 8-rank group's fit after its first 32 reports put 8.5–33 ms into a for a true 0.05 ms
  // (docs/PERFORMANCE.md). The shape weighs as much as `prior_reports` reports, so the reports
  // outweigh it wherever their shapes differ enough to say more. A tenth of a report, from the
  // mean error of the next 60 steps' batches after 4 steps of 8 ranks (3% noise; 20 seeds):
  // declared shape true 1.6% (no prior 12.9%, a weight of 4 reports 1.3%); declared linear
  // where the truth is quadratic 1.5% (no prior 9.1%; 4 reports 6.8%); declared quadratic
  // alone 2.6% (no prior 2.1%; 4 reports 23.5%). All zero: no prior (only a tiny ridge toward
  // 0 picks among equal fits).
  BatchCost prior{0, 0, 0};
  double prior_reports = 0.1;
  // Once fitted() (outliers are judged only then), a report of a rank with fewer than
  // min_reports_per_rank reports is judged at speed 1 (with 8 ranks: their 2nd and 3rd). Before,
  // a rank's few reports were judged against its own speed fitted from them alone, so a pause
  // among them could not be told from a slow rank (one ×3 pause among a rank's first 4 reports
  // made it 1.8× slow, and a warm-up re-plan gave it smaller batches for the rest of the epoch).
  // A rank slow throughout loses nothing: its reports are weighed alike, which leaves its speed.
  bool judge_first_reports_at_speed_1 = false;
};

// A cost model per rank: rank r's batch of shape x takes time ≈ speed(r) · shared().padded(x).
// Fitted by weighted least squares (relative errors: each report is weighted by 1/time², the
// predicted time once fitted, so a slow rank's long times do not dominate; outliers are
// weighted down, see CostModelOptions::huber) over the features (1, n·L, n·L²), with the rank
// factors estimated jointly by alternating least squares. Incremental: a report only adds to
// per-rank sums (O(1) time and memory per report); the fit is solved from the sums when asked.
// Speeds are normalised so that the fastest rank with enough reports has speed 1: shared() is
// then the fastest rank's model, in seconds (or whatever unit the reports use).
class CostModel {
 public:
  // REQUIRES: ranks >= 1.
  explicit CostModel(uint32_t ranks, CostModelOptions options = {});

  // Adds rank `rank`'s batch of shape `shape` that took `seconds`. Reports of empty batches, of
  // non-finite or non-positive times are ignored (returns false). REQUIRES: rank < ranks().
  bool report(uint32_t rank, const BatchShape& shape, double seconds);

  uint32_t ranks() const { return static_cast<uint32_t>(ranks_.size()); }
  uint64_t reports() const { return reports_; }
  bool fitted() const { return reports_ >= options_.min_reports; }
  // fitted(), and every rank has min_reports_per_rank reports: every speed is estimated (a
  // group's warm-up re-plan waits for this, core/run.h). O(ranks).
  bool fitted_for_every_rank() const;

  // The model at speed 1. Before fitted(): {0, 0, 0}.
  BatchCost shared() const;
  // Rank `rank`'s time factor (1 = the fastest rank; 2 = takes twice as long). 1 for a rank with
  // fewer than min_reports_per_rank reports.
  double speed(uint32_t rank) const;
  std::vector<double> speeds() const;
  // The predicted time of rank `rank`'s batch of shape `shape`; 0 before fitted().
  double predict(uint32_t rank, const BatchShape& shape) const;

 private:
  friend class RunCodec;  // core/run_codec.cc saves and restores the sums exactly
  using Vec = std::array<double, 3>;
  using Mat = std::array<Vec, 3>;
  struct RankSums {
    Mat xx{};  // Σ w·x·xᵀ
    Vec xy{};  // Σ w·x·y
    uint64_t count = 0;
  };
  void fit() const;
  // The joint least-squares fit of the sums: θ (at speed 1) and every rank's raw factor.
  void solve(Vec* theta, std::vector<double>* speed) const;

  CostModelOptions options_;
  std::vector<RankSums> ranks_;
  uint64_t reports_ = 0;
  // The fit, solved lazily from the sums (mutable: a cache of a pure function of the sums).
  mutable bool dirty_ = true;
  mutable Vec theta_{};
  mutable std::vector<double> speed_;
  // The fit outliers are judged against: refreshed only at fixed report counts, so the weights
  // depend on the reports alone, never on when a caller asked for the model.
  Vec reference_theta_{};
  std::vector<double> reference_speed_;
};

}  // namespace traincoord
