// Prometheus text exposition: a histogram, and the writer helpers that format series.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "core/utf8.h"

namespace traincoord {

// Label values escaped as the exposition format wants (backslash, quote, newline), and valid
// UTF-8 as it requires (a byte that does not start a valid character becomes U+FFFD).
inline std::string prometheus_escape(std::string_view v) {
  std::string repaired;
  if (!utf8::valid(v)) {
    repaired = utf8::repaired(v);
    v = repaired;
  }
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

inline std::string prometheus_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    counts_[i] += 1;
    sum_ += v;
    count_ += 1;
  }
  // Appends the _bucket, _sum and _count series of `name` with `labels` ("" or `a="b",...`).
  void write(std::string& out, std::string_view name, std::string_view labels) const {
    uint64_t cumulative = 0;
    const std::string sep = labels.empty() ? "" : ",";
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      cumulative += counts_[i];
      out += std::string(name) + "_bucket{" + std::string(labels) + sep + "le=\"" +
             (i < bounds_.size() ? prometheus_number(bounds_[i]) : "+Inf") + "\"} " +
             std::to_string(cumulative) + "\n";
    }
    const std::string l = labels.empty() ? "" : "{" + std::string(labels) + "}";
    out += std::string(name) + "_sum" + l + " " + prometheus_number(sum_) + "\n";
    out += std::string(name) + "_count" + l + " " + std::to_string(count_) + "\n";
  }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

}  // namespace traincoord
