// A cost-balanced step-mode run for tests (the core's and the server's views of it): speech-like
// lengths and a small config that plans a few steps per epoch.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/run_config.h"

namespace traincoord::testing {

// Speech-like lengths: 1 to 30, skewed short.
inline std::vector<double> lengths_of(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v;
  for (uint64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(rng() % 1000) / 1000.0;
    v.push_back(std::round(10 * (1 + 29 * u * u * u)) / 10);
  }
  return v;
}

// 157 train samples, 23 dev samples; a budget of 60 padded length units (b = 1).
inline RunConfig cost_config() {
  RunConfig c;
  c.name = "costs";
  c.mode = ScheduleMode::kSteps;
  c.train_samples = c.train_batches = 157;
  c.dev_samples = c.dev_batches = 23;
  c.train_lengths = lengths_of(157, 1);
  c.dev_lengths = lengths_of(23, 2);
  c.batch_budget = 60;
  c.cost = BatchCost{0, 1, 0};
  c.epochs = 3;
  c.validation_every = 1;
  c.lease_timeout_ms = 1000;
  c.seed = 5;
  return c;
}

}  // namespace traincoord::testing
