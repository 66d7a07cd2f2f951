#include "server/metrics_text.h"

#include <algorithm>

#include "server/metrics.h"
#include "server/status_view.h"

namespace traincoord {

std::string metrics_text(std::span<const Run* const> runs, TimeMs now, size_t workers_per_run) {
  std::string out;
  struct Family {
    const char* name;
    const char* type;
    const char* help;
  };
  auto head = [&](const Family& f) {
    out +=
        std::string("# HELP ") + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.type + "\n";
  };
  auto series = [&](const char* name, const std::string& labels, double value) {
    out += std::string(name) + "{" + labels + "} " + prometheus_number(value) + "\n";
  };
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
                        l + ",set=\"" + std::string(set_name(set)) + "\"",
                        static_cast<double>(*it->closed_at - it->opened_at) / 1000.0);
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
  // Per worker, capped: the first `workers_per_run` workers of a run by id get their own
  // series; the others are summed into worker="_other" (jobs) or take the largest age.
  auto each_worker = [&](const Family& f, auto&& value, bool sum) {
    head(f);
    for (const Run* run : runs) {
      const std::string l = "run=\"" + prometheus_escape(run->config().name) + "\"";
      double other = 0;
      bool any_other = false;
      for (size_t i = 0; i < run->workers().size(); ++i) {
        const double v = value(run->workers()[i]);
        if (i < workers_per_run) {
          series(f.name, l + ",worker=\"" + prometheus_escape(run->workers()[i].name) + "\"", v);
        } else {
          other = any_other ? (sum ? other + v : std::max(other, v)) : v;
          any_other = true;
        }
      }
      if (any_other) series(f.name, l + ",worker=\"_other\"", other);
    }
  };
  each_worker(
      {"traincoord_worker_jobs_done_total", "counter", "Jobs a worker completed."},
      [](const WorkerInfo& w) { return static_cast<double>(w.jobs_done); }, true);
  each_worker(
      {"traincoord_worker_last_seen_age_seconds", "gauge",
       "Seconds since a worker's last request or heartbeat."},
      [&](const WorkerInfo& w) { return static_cast<double>(now - w.last_seen) / 1000.0; }, false);
  return out;
}

}  // namespace traincoord
