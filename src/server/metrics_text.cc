#include "server/metrics_text.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "server/metrics.h"
#include "server/status_view.h"

namespace traincoord {

namespace {

// A family of series: its name, type and help, written once before its series.
struct Family {
  const char* name;
  const char* type;
  const char* help;
};

// Writes families and their series in Prometheus's text format onto `out`.
class Exposition {
 public:
  explicit Exposition(std::string& out) : out_(out) {}
  void head(const Family& f) {
    out_ +=
        std::string("# HELP ") + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.type + "\n";
  }
  void series(const char* name, const std::string& labels, double value) {
    out_ += std::string(name) + "{" + labels + "} " + prometheus_number(value) + "\n";
  }
  // One run's series of family `name` over a capped label set (`key`: ranks, workers): the
  // first `shown` members get a series each, labelled key="label(i)"; the others with a value
  // fold into key="_other", summed (`sum`) or the largest. value(i): std::optional<double>.
  template <class Label, class Value>
  void capped(const char* name, const std::string& run_labels, const char* key, size_t n,
              size_t shown, bool sum, Label&& label, Value&& value) {
    double other = 0;
    bool any_other = false;
    for (size_t i = 0; i < n; ++i) {
      const std::optional<double> v = value(i);
      if (!v) continue;
      if (i < shown) {
        series(name, run_labels + "," + key + "=\"" + label(i) + "\"", *v);
      } else {
        other = any_other ? (sum ? other + *v : std::max(other, *v)) : *v;
        any_other = true;
      }
    }
    if (any_other) series(name, run_labels + "," + key + "=\"_other\"", other);
  }

 private:
  std::string& out_;
};

const Epoch* latest_laid_out(const Run& run, SetKind set) {
  for (auto it = run.epochs().rbegin(); it != run.epochs().rend(); ++it) {
    if (it->plan.set == set && it->steps()) return &*it;
  }
  return nullptr;
}

void step_metrics(const std::vector<const Run*>& runs, size_t ranks_shown, std::string& out) {
  Exposition x(out);
  auto head = [&](const Family& f) { x.head(f); };
  auto series = [&](const char* name, const std::string& l, double v) { x.series(name, l, v); };
  auto each_set = [&](const Family& f, auto&& emit) {
    head(f);
    for (const Run* run : runs) {
      for (SetKind set : {SetKind::kTrain, SetKind::kDev}) {
        const Epoch* e = latest_laid_out(*run, set);
        if (!e) continue;
        emit(*run, *e,
             "run=\"" + prometheus_escape(run->config().name) + "\",set=\"" +
                 std::string(set_name(set)) + "\"");
      }
    }
  };
  each_set({"traincoord_run_steps", "gauge",
            "Steps of the latest epoch of each set laid out in steps: planned, and done (every "
            "batch resolved)."},
           [&](const Run&, const Epoch& e, const std::string& l) {
             const StepCounts c = e.step_counts();
             series("traincoord_run_steps", l + ",state=\"planned\"",
                    static_cast<double>(c.planned));
             series("traincoord_run_steps", l + ",state=\"done\"", static_cast<double>(c.done));
           });
  each_set({"traincoord_run_step_batches", "gauge",
            "Batches of that epoch in play: under a live lease (in_flight), or open for their "
            "rank (queued)."},
           [&](const Run&, const Epoch& e, const std::string& l) {
             const StepCounts c = e.step_counts();
             series("traincoord_run_step_batches", l + ",state=\"in_flight\"",
                    static_cast<double>(c.batches_in_flight));
             series("traincoord_run_step_batches", l + ",state=\"queued\"",
                    static_cast<double>(c.batches_queued));
           });
  each_set({"traincoord_run_step_planned_with_fitted", "gauge",
            "Cost-balanced: 1 when that epoch was planned with the fitted cost model, 0 with the "
            "declared cost."},
           [&](const Run& r, const Epoch& e, const std::string& l) {
             if (!r.config().cost_balanced()) return;
             series("traincoord_run_step_planned_with_fitted", l, e.plan_speeds.empty() ? 0 : 1);
           });
  // What an open cost-balanced epoch's plan predicts, computed once per epoch for both series
  // (a pass over the epoch's samples); null where there is nothing to predict.
  std::map<const Epoch*, PlanFigures> predictions;
  auto predicted = [&](const Run& r, const Epoch& e) -> const PlanFigures* {
    if (!r.config().cost_balanced() || e.closed() || !e.cost_plan) return nullptr;
    auto [it, fresh] = predictions.try_emplace(&e);
    if (fresh) {
      const auto& lengths =
          e.plan.set == SetKind::kTrain ? r.config().train_lengths : r.config().dev_lengths;
      it->second = predicted_figures(*e.cost_plan, e.plan_cost, lengths);
    }
    return &it->second;
  };
  each_set({"traincoord_run_step_predicted_straggling", "gauge",
            "Cost-balanced, open epochs: the mean over the plan's steps of its slowest batch's "
            "predicted time over the mean batch's."},
           [&](const Run& r, const Epoch& e, const std::string& l) {
             if (const auto* f = predicted(r, e)) {
               series("traincoord_run_step_predicted_straggling", l, f->straggling);
             }
           });
  each_set({"traincoord_run_step_predicted_padding", "gauge",
            "Cost-balanced, open epochs: 1 - the samples' own cost over the padded work the plan "
            "computes."},
           [&](const Run& r, const Epoch& e, const std::string& l) {
             if (const auto* f = predicted(r, e)) {
               series("traincoord_run_step_predicted_padding", l, f->padding);
             }
           });
  auto each_model = [&](const Family& f, auto&& emit) {
    head(f);
    for (const Run* run : runs) {
      if (const CostModel* m = run->cost_model()) {
        emit(*m, "run=\"" + prometheus_escape(run->config().name) + "\"");
      }
    }
  };
  each_model({"traincoord_run_cost_model_reports", "gauge",
              "Batch times the cost model is fitted from (since the world size last changed)."},
             [&](const CostModel& m, const std::string& l) {
               series("traincoord_run_cost_model_reports", l, static_cast<double>(m.reports()));
             });
  each_model({"traincoord_run_cost_model_fitted", "gauge", "1 once the cost model is fitted."},
             [&](const CostModel& m, const std::string& l) {
               series("traincoord_run_cost_model_fitted", l, m.fitted() ? 1 : 0);
             });
  each_model({"traincoord_run_cost_model_coefficient", "gauge",
              "The fitted cost a + b*n*L + c*n*L^2 of a padded batch at speed 1, in seconds."},
             [&](const CostModel& m, const std::string& l) {
               if (!m.fitted()) return;
               const BatchCost c = m.shared();
               series("traincoord_run_cost_model_coefficient", l + ",term=\"a\"", c.a);
               series("traincoord_run_cost_model_coefficient", l + ",term=\"b\"", c.b);
               series("traincoord_run_cost_model_coefficient", l + ",term=\"c\"", c.c);
             });
  // Per rank, capped as workers are.
  auto each_rank = [&](const Family& f, auto&& value, bool sum) {
    head(f);
    for (const Run* run : runs) {
      x.capped(
          f.name, "run=\"" + prometheus_escape(run->config().name) + "\"", "rank",
          run->rank_pace().size(), ranks_shown, sum, [](size_t r) { return std::to_string(r); },
          [&](size_t r) { return value(*run, static_cast<uint32_t>(r)); });
    }
  };
  each_rank(
      {"traincoord_run_rank_speed", "gauge",
       "The fitted time factor of each rank (1: the fastest; 2: twice as slow)."},
      [](const Run& run, uint32_t r) -> std::optional<double> {
        const CostModel* m = run.cost_model();
        if (!m || !m->fitted() || m->ranks() != run.rank_pace().size()) return std::nullopt;
        return m->speed(r);
      },
      false);
  each_rank(
      {"traincoord_run_rank_samples_per_second", "gauge",
       "Samples per second of each rank's own reported batch times (train batches)."},
      [](const Run& run, uint32_t r) -> std::optional<double> {
        return run.rank_pace()[r].samples_per_s();
      },
      true);
}

}  // namespace

std::string metrics_text(std::span<const Run* const> runs, TimeMs now, size_t workers_per_run) {
  std::string out;
  Exposition x(out);
  auto head = [&](const Family& f) { x.head(f); };
  auto series = [&](const char* name, const std::string& l, double v) { x.series(name, l, v); };
  auto each_run = [&](const Family& f, auto&& emit) {
    head(f);
    for (const Run* run : runs) emit(*run, "run=\"" + prometheus_escape(run->config().name) + "\"");
  };
  each_run({"traincoord_run_state", "gauge", "1 for the state the run is in."},
           [&](const Run& r, const std::string& l) {
             for (RunState st : {RunState::kRunning, RunState::kCompleted, RunState::kEarlyStopped,
                                 RunState::kCancelled, RunState::kFailed}) {
               series("traincoord_run_state",
                      l + ",state=\"" + std::string(run_state_name(st)) + "\"",
                      r.state() == st ? 1 : 0);
             }
           });
  each_run({"traincoord_run_epochs_done", "gauge", "Train epochs closed."},
           [&](const Run& r, const std::string& l) {
             double done = 0;
             for (const Epoch& e : r.epochs()) done += e.plan.set == SetKind::kTrain && e.closed();
             series("traincoord_run_epochs_done", l, done);
           });
  each_run({"traincoord_run_target_epoch", "gauge", "The epoch training runs up to."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_target_epoch", l, static_cast<double>(r.plan().target_epoch));
           });
  each_run(
      {"traincoord_run_jobs", "gauge", "Jobs of the run by state (open: of open epochs)."},
      [&](const Run& r, const std::string& l) {
        const Progress p = progress_of(r, now);
        series("traincoord_run_jobs", l + ",state=\"open\"", static_cast<double>(p.open));
        series("traincoord_run_jobs", l + ",state=\"running\"", static_cast<double>(p.running));
        series("traincoord_run_jobs", l + ",state=\"done\"", static_cast<double>(p.done));
        series("traincoord_run_jobs", l + ",state=\"failed\"", static_cast<double>(p.failed));
        series("traincoord_run_jobs", l + ",state=\"planned\"", static_cast<double>(p.planned));
      });
  each_run({"traincoord_run_samples_total", "counter",
            "Samples of the run's counted completions with a finite loss, by set: rate() is its "
            "samples/s. A group's restore of a cut takes off those of the jobs it reopens."},
           [&](const Run& r, const std::string& l) {
             uint64_t by_set[2] = {0, 0};
             for (const Epoch& e : r.epochs()) by_set[static_cast<int>(e.plan.set)] += e.samples;
             series("traincoord_run_samples_total", l + ",set=\"train\"",
                    static_cast<double>(by_set[0]));
             series("traincoord_run_samples_total", l + ",set=\"dev\"",
                    static_cast<double>(by_set[1]));
           });
  each_run({"traincoord_run_lease_expiries_total", "counter", "Leases that ran out."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_lease_expiries_total", l,
                    static_cast<double>(r.counters().lease_expiries));
           });
  each_run({"traincoord_run_rehandouts_total", "counter", "Jobs handed out again."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_rehandouts_total", l,
                    static_cast<double>(r.counters().rehandouts));
           });
  each_run({"traincoord_run_completions_accepted_total", "counter", "Completions counted."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_completions_accepted_total", l,
                    static_cast<double>(r.counters().completions_accepted));
           });
  each_run({"traincoord_run_completions_rejected_total", "counter",
            "Completions not counted: repeated or late (duplicate), another worker's lease "
            "(foreign), a lease never issued (unknown)."},
           [&](const Run& r, const std::string& l) {
             const RunCounters& c = r.counters();
             series("traincoord_run_completions_rejected_total", l + ",reason=\"duplicate\"",
                    static_cast<double>(c.completions_duplicate));
             series("traincoord_run_completions_rejected_total", l + ",reason=\"foreign\"",
                    static_cast<double>(c.completions_foreign));
             series("traincoord_run_completions_rejected_total", l + ",reason=\"unknown\"",
                    static_cast<double>(c.completions_unknown));
           });
  each_run({"traincoord_run_jobs_failed_total", "counter", "Jobs given up after max_attempts."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_jobs_failed_total", l,
                    static_cast<double>(r.counters().jobs_failed));
           });
  each_run({"traincoord_run_last_loss", "gauge", "The loss of the last closed epoch of each set."},
           [&](const Run& r, const std::string& l) {
             for (SetKind set : {SetKind::kTrain, SetKind::kDev}) {
               for (auto it = r.epochs().rbegin(); it != r.epochs().rend(); ++it) {
                 if (it->plan.set != set || !it->closed()) continue;
                 series("traincoord_run_last_loss",
                        l + ",set=\"" + std::string(set_name(set)) + "\"", it->loss);
                 break;
               }
             }
           });
  each_run({"traincoord_run_epoch_duration_seconds", "gauge",
            "How long the last closed epoch of each set was open (the coordinator's clock)."},
           [&](const Run& r, const std::string& l) {
             for (SetKind set : {SetKind::kTrain, SetKind::kDev}) {
               for (auto it = r.epochs().rbegin(); it != r.epochs().rend(); ++it) {
                 if (it->plan.set != set || !it->closed_at) continue;
                 series("traincoord_run_epoch_duration_seconds",
                        l + ",set=\"" + std::string(set_name(set)) + "\"", *epoch_duration_s(*it));
                 break;
               }
             }
           });
  each_run({"traincoord_run_best_dev_value", "gauge", "The best value early stopping has seen."},
           [&](const Run& r, const std::string& l) {
             if (r.early_stop().state().best_epoch) {
               series("traincoord_run_best_dev_value", l, r.early_stop().state().best_value);
             }
           });
  each_run({"traincoord_run_best_epoch", "gauge", "The epoch whose checkpoint to keep."},
           [&](const Run& r, const std::string& l) {
             if (auto b = r.early_stop().state().best_epoch) {
               series("traincoord_run_best_epoch", l, static_cast<double>(*b));
             }
           });
  each_run({"traincoord_run_early_stop_wait", "gauge", "Dev epochs since the last improvement."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_early_stop_wait", l, r.early_stop().state().wait);
           });
  each_run({"traincoord_run_early_stopped", "gauge", "1 once early stopping has fired."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_early_stopped", l, r.early_stop().state().stopped ? 1 : 0);
           });
  each_run({"traincoord_run_cuts_total", "counter", "Checkpoint cuts completed."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_cuts_total", l, static_cast<double>(r.counters().cuts));
           });
  each_run({"traincoord_run_restores_total", "counter",
            "Restores of a cut (or fresh starts) by a new group."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_restores_total", l, static_cast<double>(r.counters().restores));
           });
  each_run({"traincoord_run_jobs_withdrawn_total", "counter",
            "Completed jobs reopened by restores (their losses withdrawn)."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_jobs_withdrawn_total", l,
                    static_cast<double>(r.counters().jobs_withdrawn));
           });
  each_run({"traincoord_run_generation", "gauge",
            "The run's generation: + 1 for every group that took it over."},
           [&](const Run& r, const std::string& l) {
             series("traincoord_run_generation", l, static_cast<double>(r.generation()));
           });
  // Step mode (docs/OBSERVABILITY.md, "Step mode"): only when a run hands out steps. Per set,
  // its latest epoch laid out; per rank, the first `workers_per_run` ranks, the others summed
  // (samples/s) or the slowest (speed) into rank="_other".
  std::vector<const Run*> step_runs;
  for (const Run* run : runs) {
    if (run->mode() == ScheduleMode::kSteps) step_runs.push_back(run);
  }
  if (!step_runs.empty()) step_metrics(step_runs, workers_per_run, out);
  // Per worker, capped: the first `workers_per_run` workers of a run by id get their own
  // series; the others are summed into worker="_other" (jobs) or take the largest age.
  auto each_worker = [&](const Family& f, auto&& value, bool sum) {
    head(f);
    for (const Run* run : runs) {
      const auto& workers = run->workers();
      x.capped(
          f.name, "run=\"" + prometheus_escape(run->config().name) + "\"", "worker", workers.size(),
          workers_per_run, sum, [&](size_t i) { return prometheus_escape(workers[i].name); },
          [&](size_t i) { return std::optional<double>(value(workers[i])); });
    }
  };
  each_worker(
      {"traincoord_worker_jobs_done_total", "counter", "Jobs a worker completed."},
      [](const WorkerInfo& w) { return static_cast<double>(w.jobs_done); }, true);
  each_worker(
      {"traincoord_worker_samples_total", "counter",
       "Samples of the completions a worker reported that were counted: rate() is its "
       "samples/s."},
      [](const WorkerInfo& w) { return static_cast<double>(w.samples_done); }, true);
  each_worker(
      {"traincoord_worker_last_seen_age_seconds", "gauge",
       "Seconds since a worker's last request or heartbeat."},
      [&](const WorkerInfo& w) { return static_cast<double>(now - w.last_seen) / 1000.0; }, false);
  return out;
}

}  // namespace traincoord
