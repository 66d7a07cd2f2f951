#include "config/config_file.h"

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include <toml++/toml.h>

#include "core/step_plan.h"

namespace traincoord {

namespace {

// A number node's value as a double. (toml++'s value<double>() has none for an integer it
// cannot convert exactly, such as 2^63 - 1: found by fuzz_config.) REQUIRES: node.is_number().
double as_double(const toml::node& node) {
  if (const auto* i = node.as_integer()) return static_cast<double>(i->get());
  return node.as_floating_point()->get();
}

// Reads one TOML table, refusing keys it does not know: a typo must not be silently ignored.
class TableReader {
 public:
  TableReader(const toml::table* table, std::string prefix, std::string_view source)
      : table_(table), prefix_(std::move(prefix)), source_(source) {}

  std::string field(std::string_view key) const {
    return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
  }

  tl::unexpected<Error> bad(std::string_view key, const std::string& what) const {
    return invalid_argument(field(key), std::string(source_) + ": " + field(key) + ": " + what);
  }

  bool has(std::string_view key) {
    seen_.insert(std::string(key));
    return table_ && table_->contains(key);
  }

  Result<void> integer(std::string_view key, int64_t min, int64_t max, int64_t* out) {
    if (!has(key)) return {};
    // is_integer() first: value<int64_t>() of a float converts it, out of range too (found by
    // fuzz/fuzz_config.cc: 1e110 as train_batches was undefined behaviour).
    if (!(*table_)[key].is_integer()) return bad(key, "must be an integer");
    auto v = (*table_)[key].value<int64_t>();
    if (!v) return bad(key, "must be an integer");
    if (*v < min || *v > max) {
      return bad(key, "must be between " + std::to_string(min) + " and " + std::to_string(max));
    }
    *out = *v;
    return {};
  }

  template <typename T>
  Result<void> integer_as(std::string_view key, int64_t min, int64_t max, T* out) {
    int64_t v = static_cast<int64_t>(*out);
    if (auto r = integer(key, min, max, &v); !r) return r;
    *out = static_cast<T>(v);
    return {};
  }

  Result<void> number(std::string_view key, double* out) {
    if (!has(key)) return {};
    const toml::node& node = *table_->get(key);
    if (!node.is_number()) return bad(key, "must be a number");
    *out = as_double(node);
    if (!std::isfinite(*out)) return bad(key, "must be finite");
    return {};
  }

  Result<void> optional_number(std::string_view key, std::optional<double>* out) {
    if (!has(key)) return {};
    double v = 0;
    if (auto r = number(key, &v); !r) return r;
    *out = v;
    return {};
  }

  Result<void> boolean(std::string_view key, bool* out) {
    if (!has(key)) return {};
    auto v = (*table_)[key].value<bool>();
    if (!v) return bad(key, "must be true or false");
    *out = *v;
    return {};
  }

  Result<void> string(std::string_view key, std::string* out) {
    if (!has(key)) return {};
    auto v = (*table_)[key].value<std::string>();
    if (!v) return bad(key, "must be a string");
    *out = *v;
    return {};
  }

  // A string that must be one of `names` (a table of enum names in core/run_config.h); sets
  // *out to the value it names.
  template <typename Enum, size_t N>
  Result<void> choice(std::string_view key, const std::array<std::string_view, N>& names,
                      Enum* out) {
    if (!has(key)) return {};
    auto v = (*table_)[key].value<std::string>();
    if (v) {
      if (auto value = parse_enum<Enum>(names, *v)) {
        *out = *value;
        return {};
      }
    }
    std::string list;
    for (size_t i = 0; i < N; ++i) {
      list += (i ? ", " : "") + std::string("\"") + std::string(names[i]) + "\"";
    }
    return bad(key, "must be one of " + list);
  }

  // Fails on the first key that none of the calls above asked for.
  Result<void> no_unknown_keys() const {
    if (!table_) return {};
    for (const auto& [key, node] : *table_) {
      if (seen_.count(std::string(key.str())) == 0) {
        return bad(key.str(), "unknown key (check its spelling and docs/CONFIG.md)");
      }
    }
    return {};
  }

 private:
  const toml::table* table_;
  std::string prefix_;
  std::string_view source_;
  std::set<std::string> seen_;
};

#define TC_TRY(expr)                                              \
  do {                                                            \
    if (auto r_ = (expr); !r_) return tl::unexpected(r_.error()); \
  } while (0)

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxCount = int64_t{1} << 50;

Result<void> read_data(TableReader& t, RunConfig* c) {
  std::string train_lengths, dev_lengths;  // (read by read_lengths)
  TC_TRY(t.string("train_lengths", &train_lengths));
  TC_TRY(t.string("dev_lengths", &dev_lengths));
  int64_t train_batches = -1, dev_batches = -1, train_samples = -1, dev_samples = -1;
  int64_t batch_size = 0;
  TC_TRY(t.integer("train_batches", 1, kMaxCount, &train_batches));
  TC_TRY(t.integer("dev_batches", 0, kMaxCount, &dev_batches));
  TC_TRY(t.integer("train_samples", 1, kMaxCount, &train_samples));
  TC_TRY(t.integer("dev_samples", 0, kMaxCount, &dev_samples));
  TC_TRY(t.integer("batch_size", 1, kMaxCount, &batch_size));
  TC_TRY(t.choice("order", kBatchOrderNames, &c->order));
  TC_TRY(t.integer_as("seed", 0, std::numeric_limits<int64_t>::max(), &c->seed));
  TC_TRY(t.no_unknown_keys());  // a misspelt key says so before anything is found missing

  auto batches = [&](int64_t samples) {
    return static_cast<uint64_t>((samples + batch_size - 1) / batch_size);
  };
  if (train_batches >= 0 && train_samples >= 0) {
    return t.bad("train_samples", "give train_batches or train_samples, not both");
  }
  if (dev_batches >= 0 && dev_samples >= 0) {
    return t.bad("dev_samples", "give dev_batches or dev_samples, not both");
  }
  if (c->batch_budget > 0 && batch_size == 0) {  // cost-balanced: batches are planned per epoch
    if (train_batches >= 0 || dev_batches >= 0) {
      return t.bad(train_batches >= 0 ? "train_batches" : "dev_batches",
                   "cost-balanced step mode (schedule.batch_budget) counts samples: give "
                   "train_samples and dev_samples instead");
    }
    c->train_samples = static_cast<uint64_t>(std::max<int64_t>(0, train_samples));
    c->dev_samples = static_cast<uint64_t>(std::max<int64_t>(0, dev_samples));
    c->train_batches = c->train_samples;  // at most one batch per sample; laid out per epoch
    c->dev_batches = c->dev_samples;
    if (train_samples < 0) return t.bad("train_samples", "missing: give the set's size");
    return {};
  }
  if ((train_samples >= 0 || dev_samples >= 0) && batch_size == 0) {
    return t.bad("batch_size",
                 "needed to turn samples into batches: batches = ceil(samples / "
                 "batch_size)");
  }
  if (train_batches < 0 && train_samples < 0) {
    return t.bad("train_batches", "missing: give train_batches, or train_samples and batch_size");
  }
  c->train_batches = train_samples >= 0 ? batches(train_samples) : train_batches;
  c->dev_batches = dev_samples >= 0 ? batches(dev_samples) : std::max<int64_t>(0, dev_batches);
  c->batch_size = static_cast<uint64_t>(batch_size);
  c->train_samples = static_cast<uint64_t>(std::max<int64_t>(0, train_samples));
  c->dev_samples = static_cast<uint64_t>(std::max<int64_t>(0, dev_samples));
  return {};
}

Result<void> read_schedule(TableReader& t, RunConfig* c) {
  TC_TRY(t.integer_as("epochs", -1'000'000, 1'000'000, &c->epochs));
  // Without a dev set there is nothing to validate: validation_every then defaults to 0.
  if (!t.has("validation_every") && c->dev_batches == 0) c->validation_every = 0;
  TC_TRY(t.integer_as("validation_every", 0, kMaxInt, &c->validation_every));
  TC_TRY(t.integer_as("gpus_per_worker", 1, 1 << 16, &c->gpus_per_worker));
  TC_TRY(t.integer_as("iters_per_worker", 0, 1 << 20, &c->iters_per_worker));
  TC_TRY(t.integer_as("replicas_to_agg", 0, 1 << 20, &c->replicas_to_agg));
  TC_TRY(t.integer_as("start_step", 0, std::numeric_limits<int64_t>::max(), &c->start_step));
  TC_TRY(t.boolean("seed_compat", &c->seed_compat));
  TC_TRY(t.boolean("overlap_epochs", &c->overlap_epochs));
  TC_TRY(t.choice("mode", kScheduleModeNames, &c->mode));
  if (t.has("batch_budget")) {
    c->batch_budget = 0;
    TC_TRY(t.number("batch_budget", &c->batch_budget));
    if (c->batch_budget <= 0) return t.bad("batch_budget", "must be a number above 0");
  }
  TC_TRY(t.number("cost_a", &c->cost.a));
  TC_TRY(t.number("cost_b", &c->cost.b));
  TC_TRY(t.number("cost_c", &c->cost.c));
  return t.no_unknown_keys();
}

Result<void> read_leases(TableReader& t, RunConfig* c) {
  double timeout_s = static_cast<double>(c->lease_timeout_ms) / 1000.0;
  TC_TRY(t.number("timeout", &timeout_s));
  if (timeout_s < 0.001 || timeout_s > 7 * 24 * 3600.0) {
    return t.bad("timeout", "must be between 0.001 and 604800 seconds");
  }
  c->lease_timeout_ms = static_cast<int64_t>(std::llround(timeout_s * 1000.0));
  TC_TRY(t.integer_as("max_attempts", 1, 1000, &c->max_attempts));
  TC_TRY(t.choice("on_job_failure", kJobFailurePolicyNames, &c->on_job_failure));
  TC_TRY(t.integer_as("history", 1, 1 << 26, &c->lease_history));
  return t.no_unknown_keys();
}

Result<void> read_cuts(TableReader& t, RunConfig* c) {
  TC_TRY(t.integer_as("keep", 1, 1000, &c->keep_cuts));
  return t.no_unknown_keys();
}

Result<void> read_early_stop(TableReader& t, RunConfig* c) {
  EarlyStopConfig& es = c->early_stop;
  TC_TRY(t.choice("rule", kEarlyStopKindNames, &es.kind));
  // Window rule.
  TC_TRY(t.integer_as("window", 0, 1 << 20, &es.window.window));
  TC_TRY(t.number("mean_threshold", &es.window.mean_threshold));
  TC_TRY(t.number("std_threshold", &es.window.std_threshold));
  // Patience rule.
  PatienceRuleConfig& p = es.patience;
  TC_TRY(t.string("monitor", &p.monitor));
  TC_TRY(t.choice("mode", kMonitorModeNames, &p.mode));
  TC_TRY(t.number("min_delta", &p.min_delta));
  TC_TRY(t.integer_as("patience", 0, 1 << 20, &p.patience));
  TC_TRY(t.optional_number("baseline", &p.baseline));
  TC_TRY(t.optional_number("stopping_threshold", &p.stopping_threshold));
  TC_TRY(t.optional_number("divergence_threshold", &p.divergence_threshold));
  TC_TRY(t.boolean("check_finite", &p.check_finite));
  return t.no_unknown_keys();
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The lengths of one set: inline ([lengths] SET = [...], with its checksum SET_xxh3: what the
// server stores with the run), else from the file data.SET_lengths names (a path relative to
// the config file's folder; files are read only from config files, `base` not null).
Result<void> read_set_lengths(const toml::table& root, TableReader& lengths, std::string_view set,
                              const std::filesystem::path* base, std::string_view source,
                              std::vector<double>* out, uint64_t* checksum) {
  const std::string key(set), sum_key = key + "_xxh3", file_key = key + "_lengths";
  const bool has_inline = lengths.has(key);
  const bool has_sum = lengths.has(sum_key);
  if (has_inline) {
    const toml::array* array = root["lengths"][key].as_array();
    if (!array) return lengths.bad(key, "must be an array of lengths (numbers >= 0)");
    out->reserve(array->size());
    for (size_t i = 0; i < array->size(); ++i) {
      const toml::node& v = *array->get(i);
      if (!v.is_number()) {
        return lengths.bad(key, "element " + std::to_string(i) + " is not a number");
      }
      out->push_back(as_double(v));
    }
    *checksum = lengths_checksum(*out);
    if (has_sum) {
      std::string given;
      TC_TRY(lengths.string(sum_key, &given));
      if (given != hex(*checksum)) {
        return lengths.bad(sum_key, "the lengths' checksum is " + hex(*checksum) + ", not " +
                                        given + ": the stored lengths are damaged");
      }
    }
    return {};
  }
  if (has_sum) return lengths.bad(sum_key, "a checksum without lengths." + key);
  auto file = root["data"][file_key].value<std::string>();
  if (!file) return {};
  const std::string field = "data." + file_key;
  if (!base) {
    return invalid_argument(field, std::string(source) + ": " + field +
                                       ": a lengths file is read only from a config file; "
                                       "give the lengths inline as lengths." +
                                       key + " = [...]");
  }
  const std::filesystem::path path =
      base->empty() ? std::filesystem::path(*file) : (*base / std::filesystem::path(*file));
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return invalid_argument(field, std::string(source) + ": " + field + ": cannot read " +
                                       path.string() + " (one length per line)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  auto parsed = parse_lengths(text.str(), path.string());
  if (!parsed) {
    Error e = parsed.error();
    e.field = field;
    e.message = std::string(source) + ": " + field + ": " + e.message;
    return tl::unexpected(e);
  }
  *out = std::move(*parsed);
  *checksum = lengths_checksum(*out);
  return {};
}

}  // namespace

Result<RunConfig> parse_run_config_table(const toml::table& root, std::string_view source,
                                         const std::filesystem::path* base) {
  RunConfig c;
  // (data's sizes are read knowing whether batches are cost-balanced)
  if (root["schedule"]["batch_budget"]) c.batch_budget = 1;
  TableReader top(&root, "", source);
  TC_TRY(top.string("name", &c.name));
  struct Section {
    const char* name;
    Result<void> (*read)(TableReader&, RunConfig*);
  };
  for (const Section& s : {Section{"data", read_data}, Section{"schedule", read_schedule},
                           Section{"leases", read_leases}, Section{"cuts", read_cuts},
                           Section{"early_stop", read_early_stop}}) {
    const bool present = top.has(s.name);
    const toml::table* table = present ? root[s.name].as_table() : nullptr;
    if (present && !table) {
      return top.bad(s.name, "must be a table ([" + std::string(s.name) + "])");
    }
    if (!table && std::string_view(s.name) == "data") {
      return top.bad("data", "missing: a run needs a [data] table with train_batches");
    }
    TableReader reader(table, s.name, source);
    TC_TRY(s.read(reader, &c));
  }
  {
    const bool present = top.has("lengths");
    const toml::table* table = present ? root["lengths"].as_table() : nullptr;
    if (present && !table) return top.bad("lengths", "must be a table ([lengths])");
    TableReader lengths(table, "lengths", source);
    TC_TRY(read_set_lengths(root, lengths, "train", base, source, &c.train_lengths,
                            &c.train_lengths_xxh64));
    TC_TRY(
        read_set_lengths(root, lengths, "dev", base, source, &c.dev_lengths, &c.dev_lengths_xxh64));
    TC_TRY(lengths.no_unknown_keys());
  }
  TC_TRY(top.no_unknown_keys());
  if (auto ok = validate(c); !ok) {
    Error e = ok.error();
    e.message = std::string(source) + ": " + e.message;
    return tl::unexpected(e);
  }
  return c;
}

namespace {

// `base`: where the files a config names are read from (null: none is read).
Result<RunConfig> parse_toml_config(std::string_view text, std::string_view source,
                                    const std::filesystem::path* base) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << source << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
        << e.description();
    return invalid_argument("", msg.str());
  }
  return parse_run_config_table(root, source, base);
}

}  // namespace

Result<RunConfig> parse_run_config(std::string_view text, std::string_view source) {
  const std::filesystem::path base = std::filesystem::path(source).parent_path();
  return parse_toml_config(text, source, &base);
}

Result<RunConfig> parse_sent_run_config(std::string_view text, std::string_view source) {
  return parse_toml_config(text, source, nullptr);
}

std::string durable_config_text(std::string_view toml, const RunConfig& config) {
  std::string out(toml);
  if (config.train_lengths.empty() && config.dev_lengths.empty()) return out;
  try {
    if (toml::parse(toml)["lengths"]) return out;  // inline already
  } catch (const toml::parse_error&) {
    return out;  // (it parsed before; never reached)
  }
  out +=
      "\n# Written by traincoord when the run was created: the lengths the files named in\n"
      "# [data] held then, with their checksum (docs/CONFIG.md, \"Cost-balanced steps\").\n"
      "[lengths]\n";
  for (auto [name, lengths, sum] :
       {std::tuple{"train", &config.train_lengths, config.train_lengths_xxh64},
        std::tuple{"dev", &config.dev_lengths, config.dev_lengths_xxh64}}) {
    if (lengths->empty()) continue;
    out += std::string(name) + " = [";
    char buf[40];
    for (size_t i = 0; i < lengths->size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s%.17g", i == 0 ? "" : ", ", (*lengths)[i]);
      out += buf;
    }
    out += "]\n" + std::string(name) + "_xxh3 = \"" + hex(sum) + "\"\n";
  }
  return out;
}

Result<RunConfig> load_run_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalid_argument("config", "cannot read run config " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_run_config(text.str(), path);
}

Result<RunConfig> parse_stored_run_config(std::string_view format, std::string_view text,
                                          std::string_view source) {
  const bool json =
      format == kStoredJson || format == "json/3" || format == "json/2" || format == "json";
  if (!json && format != kStoredToml && format != "toml/3" && format != "toml/2" &&
      format != "toml") {
    return invalid_argument("config_format", std::string(source) + ": a config stored as \"" +
                                                 std::string(format.substr(0, 32)) +
                                                 "\", which this build does not read");
  }
  auto config = json ? parse_run_config_json(text, source) : parse_run_config(text, source);
  // Stored before "auto" existed: no schedule.mode meant jobs (an explicit "auto" could not be).
  if (config && (format == "toml" || format == "json") && config->mode == ScheduleMode::kAuto) {
    config->mode = ScheduleMode::kJobs;
  }
  // Stored before a rule of cost-balanced step mode: the run keeps the rules it was answered
  // under (the warm-up re-plan since "/3", the declared shape's fit since "/4").
  const bool current = format == kStoredToml || format == kStoredJson;
  if (config && !current) config->declared_shape_fit = false;
  if (config && !current && format != "toml/3" && format != "json/3") {
    config->warm_up_replan = false;
  }
  return config;
}

}  // namespace traincoord
