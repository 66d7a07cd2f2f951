#include "config/config_diff.h"

#include <array>
#include <cmath>
#include <cstddef>
#include <optional>

namespace traincoord {

namespace {

bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }
bool same(const std::optional<double>& a, const std::optional<double>& b) {
  return a.has_value() == b.has_value() && (!a || same(*a, *b));
}
bool same(const BatchCost& a, const BatchCost& b) {
  return same(a.a, b.a) && same(a.b, b.b) && same(a.c, b.c);
}
template <typename T>
bool same(const T& a, const T& b) {
  return a == b;
}

// The number of members of the aggregate T: the most initializers T{...} accepts. (An
// initializer that converts to anything is never split by brace elision, so a member that is
// itself an aggregate counts once.)
struct AnyField {
  template <typename T>
  operator T() const {  // NOLINT(google-explicit-constructor): only in unevaluated contexts
    return T{};         // (never instantiated: defined only so that clang has a definition)
  }
};
template <typename T, typename... Fields>
constexpr size_t member_count() {
  if constexpr (requires { T{Fields{}..., AnyField{}}; }) {
    return member_count<T, Fields..., AnyField>();
  } else {
    return sizeof...(Fields);
  }
}

// One row per field: its name in the config file, whether a started run may change it, and how
// to compare it. A new field of RunConfig (or of its early-stop parts) needs a row here, and
// the counts below updated: the build stops until it has both.
#define TC_FIELD(name, member, changeable)                                              \
  ConfigField {                                                                         \
    name, changeable,                                                                   \
        [](const RunConfig& a, const RunConfig& b) { return same(a.member, b.member); } \
  }
constexpr bool kFixed = false;      // shapes the plan: a started run keeps its value
constexpr bool kChangeable = true;  // a started run can take a new value

constexpr std::array kFields = {
    TC_FIELD("data.train_batches", train_batches, kFixed),
    TC_FIELD("data.dev_batches", dev_batches, kFixed),
    TC_FIELD("data.batch_size", batch_size, kFixed),
    TC_FIELD("data.train_samples", train_samples, kFixed),
    TC_FIELD("data.dev_samples", dev_samples, kFixed),
    TC_FIELD("data.order", order, kFixed),
    TC_FIELD("data.seed", seed, kFixed),
    TC_FIELD("schedule.gpus_per_worker", gpus_per_worker, kFixed),
    TC_FIELD("schedule.iters_per_worker", iters_per_worker, kFixed),
    TC_FIELD("schedule.replicas_to_agg", replicas_to_agg, kFixed),
    TC_FIELD("schedule.epochs", epochs, kChangeable),  // raised; lowered to what is opened
    TC_FIELD("schedule.validation_every", validation_every, kFixed),
    TC_FIELD("schedule.start_step", start_step, kFixed),
    TC_FIELD("schedule.seed_compat", seed_compat, kFixed),
    TC_FIELD("schedule.overlap_epochs", overlap_epochs, kFixed),
    // A config that leaves the mode to its default ("auto") keeps whatever mode the run has:
    // one it chose, or one a config stored before "auto" existed meant (config_differences
    // gets the stored config first). A mode given must be the stored one.
    ConfigField{"schedule.mode", kFixed,
                [](const RunConfig& stored, const RunConfig& given) {
                  return given.mode == ScheduleMode::kAuto || stored.mode == given.mode;
                }},
    TC_FIELD("schedule.batch_budget", batch_budget, kFixed),
    TC_FIELD("schedule.cost", cost, kFixed),
    TC_FIELD("data.train_lengths", train_lengths, kFixed),
    TC_FIELD("data.dev_lengths", dev_lengths, kFixed),
    TC_FIELD("lengths.train_xxh3", train_lengths_xxh64, kFixed),
    TC_FIELD("lengths.dev_xxh3", dev_lengths_xxh64, kFixed),
    TC_FIELD("leases.timeout", lease_timeout_ms, kChangeable),
    TC_FIELD("leases.max_attempts", max_attempts, kChangeable),
    TC_FIELD("leases.on_job_failure", on_job_failure, kChangeable),
    TC_FIELD("leases.history", lease_history, kFixed),
    TC_FIELD("cuts.keep", keep_cuts, kChangeable),
    TC_FIELD("early_stop.rule", early_stop.kind, kChangeable),
    TC_FIELD("early_stop.window", early_stop.window.window, kChangeable),
    TC_FIELD("early_stop.mean_threshold", early_stop.window.mean_threshold, kChangeable),
    TC_FIELD("early_stop.std_threshold", early_stop.window.std_threshold, kChangeable),
    TC_FIELD("early_stop.monitor", early_stop.patience.monitor, kChangeable),
    TC_FIELD("early_stop.mode", early_stop.patience.mode, kChangeable),
    TC_FIELD("early_stop.min_delta", early_stop.patience.min_delta, kChangeable),
    TC_FIELD("early_stop.patience", early_stop.patience.patience, kChangeable),
    TC_FIELD("early_stop.baseline", early_stop.patience.baseline, kChangeable),
    TC_FIELD("early_stop.stopping_threshold", early_stop.patience.stopping_threshold, kChangeable),
    TC_FIELD("early_stop.divergence_threshold", early_stop.patience.divergence_threshold,
             kChangeable),
    TC_FIELD("early_stop.check_finite", early_stop.patience.check_finite, kChangeable),
};
#undef TC_FIELD

// RunConfig: 26 fields listed, plus `name` (never compared) and `early_stop` (listed by its
// parts: its `kind` as early_stop.rule, and every member of `window` and `patience`), and
// `warm_up_replan` and `declared_shape_fit` (not config keys: the format the config was stored
// in decides them, and a config applied anew takes the new one's, journalled with a snapshot).
static_assert(member_count<RunConfig>() == 31,
              "RunConfig gained or lost a field: list it in kFields (and update this count)");
static_assert(member_count<EarlyStopConfig>() == 3,
              "EarlyStopConfig gained or lost a field: list it in kFields");
static_assert(member_count<WindowRuleConfig>() == 3,
              "WindowRuleConfig gained or lost a field: list it in kFields");
static_assert(member_count<PatienceRuleConfig>() == 8,
              "PatienceRuleConfig gained or lost a field: list it in kFields");
static_assert(kFields.size() == (29 - 2) + 1 + 3 + 8, "kFields must list every field once");

}  // namespace

std::span<const ConfigField> config_fields() { return kFields; }

std::vector<std::string> config_differences(const RunConfig& stored, const RunConfig& given) {
  std::vector<std::string> out;
  for (const ConfigField& f : kFields) {
    if (!f.same(stored, given)) out.emplace_back(f.name);
  }
  return out;
}

bool changeable_in_a_started_run(const std::string& field) {
  for (const ConfigField& f : kFields) {
    if (f.name == field) return f.changeable;
  }
  return false;
}

}  // namespace traincoord
