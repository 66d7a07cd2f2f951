#include "server/status_view.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "server/wall_time.h"

namespace traincoord {

void write_config(JsonWriter& j, const RunConfig& c) {
  j.begin_object();
  j.field("train_batches", c.train_batches);
  j.field("dev_batches", c.dev_batches);
  j.field("batch_size", c.batch_size);
  if (c.train_samples > 0) j.field("train_samples", c.train_samples);
  if (c.dev_samples > 0) j.field("dev_samples", c.dev_samples);
  j.field("order", batch_order_name(c.order));
  j.field("seed", c.seed);
  j.field("mode", schedule_mode_name(c.mode));
  j.field("epochs", c.epochs);
  j.field("validation_every", c.validation_every);
  j.field("gpus_per_worker", c.gpus_per_worker);
  j.field("iters_per_worker", c.iters_per_worker);
  j.field("replicas_to_agg", c.replicas_to_agg);
  j.field("start_step", c.start_step);
  j.field("seed_compat", c.seed_compat);
  j.field("overlap_epochs", c.overlap_epochs);
  j.field("lease_timeout_ms", c.lease_timeout_ms);
  j.field("max_attempts", c.max_attempts);
  j.field("on_job_failure", job_failure_policy_name(c.on_job_failure));
  j.field("keep_cuts", c.keep_cuts);
  j.field("early_stop", early_stop_kind_name(c.early_stop.kind));
  if (c.cost_balanced()) {  // cost-balanced step mode
    j.field("batch_budget", c.batch_budget);
    j.key("cost").begin_object();
    j.field("a", c.cost.a).field("b", c.cost.b).field("c", c.cost.c);
    j.end_object();
    char sum[17];
    j.key("lengths").begin_object();
    for (auto [name, lengths, checksum] :
         {std::tuple{"train", &c.train_lengths, c.train_lengths_xxh64},
          std::tuple{"dev", &c.dev_lengths, c.dev_lengths_xxh64}}) {
      if (lengths->empty()) continue;
      std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(checksum));
      j.key(name).begin_object().field("count", static_cast<uint64_t>(lengths->size()));
      j.field("xxh3", sum).end_object();
    }
    j.end_object();
  }
  j.end_object();
}

void write_cost_model(JsonWriter& j, const CostModel* model) {
  if (!model) {
    j.null();
    return;
  }
  j.begin_object();
  j.field("ranks", static_cast<uint64_t>(model->ranks()));
  j.field("reports", model->reports());
  j.field("fitted", model->fitted());
  const BatchCost cost = model->shared();
  j.field("model", cost.describe());
  j.field("a", cost.a).field("b", cost.b).field("c", cost.c);
  j.key("speeds").begin_array();
  for (double v : model->speeds()) j.value(v);
  j.end_array();
  j.end_object();
}

void write_steps(JsonWriter& j, const Run& run) {
  const RunConfig& config = run.config();
  j.begin_object();
  j.field("world_size", static_cast<uint64_t>(run.group_ranks()));
  // Per set, its latest epoch laid out in steps (the current one while it is open).
  j.key("sets").begin_array();
  for (SetKind set : {SetKind::kTrain, SetKind::kDev}) {
    const Epoch* latest = nullptr;
    for (auto it = run.epochs().rbegin(); it != run.epochs().rend() && !latest; ++it) {
      if (it->plan.set == set && it->steps()) latest = &*it;
    }
    if (!latest) continue;
    const Epoch& e = *latest;
    const StepCounts c = e.step_counts();
    j.begin_object();
    j.field("set", set_name(set));
    j.field("epoch", e.plan.epoch);
    j.field("closed", e.closed());
    j.field("ranks", static_cast<uint64_t>(e.ranks));
    j.field("planned", c.planned);
    j.field("done", c.done);
    j.field("batches_in_flight", c.batches_in_flight);
    j.field("batches_queued", c.batches_queued);
    j.key("planned_with");
    if (config.cost_balanced()) {
      j.value(e.plan_speeds.empty() ? "declared" : "fitted");
    } else {
      j.null();
    }
    // What the epoch's plan predicts, while it is at hand (an open epoch's plan is: its
    // hand-outs use it; a status never plans an epoch to show it).
    j.key("predicted");
    if (config.cost_balanced() && !e.closed() && e.cost_plan) {
      const PlanFigures f =
          predicted_figures(*e.cost_plan, e.plan_cost,
                            set == SetKind::kTrain ? config.train_lengths : config.dev_lengths);
      j.begin_object();
      j.field("straggling", f.straggling).field("padding", f.padding);
      j.field("buckets", static_cast<uint64_t>(e.cost_plan->buckets));
      j.end_object();
    } else {
      j.null();
    }
    j.end_object();
  }
  j.end_array();
  // Each rank's pace (the first kRanksShown ranks), from the batch times it reported.
  const std::vector<RankPace>& pace = run.rank_pace();
  j.field("ranks_total", static_cast<uint64_t>(pace.size()));
  j.key("ranks").begin_array();
  const CostModel* model = run.cost_model();
  for (size_t r = 0; r < pace.size() && r < kRanksShown; ++r) {
    j.begin_object();
    j.field("rank", static_cast<uint64_t>(r));
    j.field("batches", pace[r].batches).field("samples", pace[r].samples);
    j.field("seconds", pace[r].seconds);
    j.field("samples_per_s", pace[r].samples_per_s());
    j.key("speed");
    if (model && model->ranks() == pace.size() && model->fitted()) {
      j.value(model->speed(static_cast<uint32_t>(r)));
    } else {
      j.null();
    }
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

Progress progress_of(const Run& run, TimeMs now) {
  Progress p;
  p.planned = run.planned_jobs();
  for (const Epoch& e : run.epochs()) {
    p.done += e.done;
    p.failed += e.failed;
    p.running += e.leased;
    if (!e.closed()) p.open += e.open_jobs();
  }
  if (!run.epochs().empty()) {
    const double elapsed_s = static_cast<double>(now - run.epochs().front().opened_at) / 1000.0;
    if (elapsed_s > 0) p.rate_per_s = static_cast<double>(p.done + p.failed) / elapsed_s;
  }
  if (run.state() == RunState::kRunning && p.rate_per_s > 0 && p.planned >= p.done + p.failed) {
    p.eta_s = static_cast<double>(p.planned - p.done - p.failed) / p.rate_per_s;
  }
  return p;
}

std::optional<double> epoch_duration_s(const Epoch& e) {
  if (!e.closed_at) return std::nullopt;
  return static_cast<double>(*e.closed_at - e.opened_at) / 1000.0;
}

void write_epoch(JsonWriter& j, const Epoch& e, TimeMs now, int64_t wall_now_ms) {
  j.begin_object();
  j.field("set", set_name(e.plan.set));
  j.field("epoch", e.plan.epoch);
  j.field("first_job", e.plan.first_job);
  j.field("end_job", e.plan.end_job);
  j.field("jobs", e.plan.size());
  j.field("done", e.done);
  j.field("failed", e.failed);
  j.field("running", e.leased);
  j.field("open", e.closed() ? uint64_t{0} : e.open_jobs());
  j.field("closed", e.closed());
  if (e.steps()) {  // step mode: the layout of the epoch's jobs (since step_base) in steps
    j.field("ranks", static_cast<uint64_t>(e.ranks));
    j.field("steps", (e.plan.end_job - e.step_base) / e.ranks);
    if (e.plan_cost.b + e.plan_cost.c > 0) {  // cost-balanced: what its steps were planned with
      j.key("planned_with").begin_object();
      // The frozen speeds are the fitted model's; the declared cost comes with none.
      j.field("source", e.plan_speeds.empty() ? "declared" : "fitted");
      j.field("model", e.plan_cost.describe());
      j.key("speeds").begin_array();
      for (double v : e.plan_speeds) j.value(v);
      j.end_array();
      if (e.cost_plan) j.field("buckets", static_cast<uint64_t>(e.cost_plan->buckets));
      if (e.replanned_after > 0) {  // the warm-up re-plan: its first steps kept as declared
        j.field("replanned_after", e.replanned_after);
        j.field("first_model", e.first_cost.describe());
      }
      j.end_object();
    }
  }
  j.key("loss");
  if (e.closed()) {
    j.value(e.loss);
  } else {
    j.null();
  }
  j.field("samples", e.samples);
  j.field("nonfinite_jobs", e.nonfinite_jobs);
  j.key("metrics").begin_object();
  for (const Epoch::MetricSum& m : e.metrics) j.field(m.name, e.metric(m.name, true));
  j.end_object();
  j.key("failed_jobs").begin_array();
  for (uint64_t f : e.failed_jobs) j.value(f);
  j.end_array();
  j.field("opened_ago_ms", now - e.opened_at);
  j.key("closed_ago_ms");
  if (e.closed_at) {
    j.value(now - *e.closed_at);
  } else {
    j.null();
  }
  j.field("opened_at", iso8601_utc(wall_now_ms - (now - e.opened_at)));
  j.key("closed_at");
  if (e.closed_at) {
    j.value(iso8601_utc(wall_now_ms - (now - *e.closed_at)));
  } else {
    j.null();
  }
  // From opening to closing, on the coordinator's clock (null while open).
  j.key("duration_s");
  if (const std::optional<double> d = epoch_duration_s(e)) {
    j.value(*d);
  } else {
    j.null();
  }
  j.end_object();
}

void write_status(JsonWriter& j, const Run& run, TimeMs now, uint64_t epochs_shown,
                  int64_t wall_now_ms) {
  const Plan& plan = run.plan();
  j.begin_object();
  j.field("run", run.config().name);
  j.field("state", run_state_name(run.state()));
  j.field("reason", run.state_reason());
  // How it hands out work: "jobs", "steps", or "auto" until its first acquire chooses.
  j.field("mode", schedule_mode_name(run.mode()));
  j.key("config");
  write_config(j, run.config());
  j.key("plan").begin_object();
  j.field("batches_per_job", plan.batches_per_job);
  j.field("batches_per_step", plan.batches_per_step);
  j.field("steps_per_epoch", plan.steps_per_epoch);
  j.field("start_epoch", plan.start_epoch);
  j.field("jobs_trained", plan.jobs_trained);
  j.field("target_epoch", plan.target_epoch);
  j.field("train_jobs_per_epoch", plan.train_jobs_per_epoch);
  j.field("dev_jobs_per_epoch", plan.dev_jobs_per_epoch);
  j.end_object();

  const Progress p = progress_of(run, now);
  j.key("progress").begin_object();
  j.field("jobs_planned", p.planned);
  j.field("jobs_done", p.done);
  j.field("jobs_failed", p.failed);
  j.field("jobs_running", p.running);
  j.field("jobs_open", p.open);
  j.field("jobs_per_s", p.rate_per_s);
  j.key("eta_s");
  if (p.eta_s) {
    j.value(*p.eta_s);
  } else {
    j.null();
  }
  j.end_object();

  if (run.config().cost_balanced()) {
    j.key("cost_model");  // fitted from the batch times the ranks report
    write_cost_model(j, run.cost_model());
  }
  if (run.mode() == ScheduleMode::kSteps) {
    j.key("steps");  // the steps of each set's latest epoch, the ranks' pace
    write_steps(j, run);
  }

  j.key("current");
  const Epoch* current = nullptr;
  for (const Epoch& e : run.epochs()) {
    if (!e.closed()) {
      current = &e;
      break;
    }
  }
  if (current) {
    write_epoch(j, *current, now, wall_now_ms);
  } else {
    j.null();
  }
  // Epochs are numbered from 0 in opening order (their position): `epochs_total` were opened,
  // and the list holds positions epochs_from .. epochs_total - 1.
  const auto& epochs = run.epochs();
  const size_t from = epochs.size() - std::min<size_t>(epochs.size(), epochs_shown);
  j.field("epochs_total", static_cast<uint64_t>(epochs.size()));
  j.field("epochs_from", static_cast<uint64_t>(from));
  j.key("epochs").begin_array();
  for (size_t i = from; i < epochs.size(); ++i) write_epoch(j, epochs[i], now, wall_now_ms);
  j.end_array();

  const EarlyStopState& es = run.early_stop().state();
  j.key("early_stop").begin_object();
  j.field("rule", early_stop_kind_name(run.config().early_stop.kind));
  j.field("monitor", run.early_stop().monitor());
  j.key("best_epoch");
  if (es.best_epoch) {
    j.value(*es.best_epoch);
  } else {
    j.null();
  }
  j.field("best_value", es.best_value);
  j.field("wait", es.wait);
  j.field("stopped", es.stopped);
  j.key("stopped_at_epoch");
  if (es.stopped_at_epoch) {
    j.value(*es.stopped_at_epoch);
  } else {
    j.null();
  }
  j.field("reason", es.reason);
  j.field("observed_total", static_cast<uint64_t>(es.observed.size()));
  j.key("observed").begin_array();
  for (size_t i = es.observed.size() - std::min(es.observed.size(), kObservedShown);
       i < es.observed.size(); ++i) {
    const auto& [epoch, value] = es.observed[i];
    j.begin_object().field("epoch", epoch).field("value", value).end_object();
  }
  j.end_array();
  j.end_object();

  j.key("workers").begin_array();
  for (size_t i = 0; i < run.workers().size(); ++i) {
    const WorkerInfo& w = run.workers()[i];
    j.begin_object();
    j.field("id", static_cast<uint64_t>(i));
    j.field("name", w.name);
    j.field("active", w.active);
    j.field("jobs_done", w.jobs_done);
    j.field("samples_done", w.samples_done);
    j.key("leases").begin_array();
    for (LeaseId l : w.leases) j.value(l);
    j.end_array();
    j.field("last_seen_ago_ms", now - w.last_seen);
    j.end_object();
  }
  j.end_array();

  const RunCounters& c = run.counters();
  j.key("counters").begin_object();
  j.field("handouts", c.handouts);
  j.field("rehandouts", c.rehandouts);
  j.field("lease_expiries", c.lease_expiries);
  j.field("completions_accepted", c.completions_accepted);
  j.field("completions_duplicate", c.completions_duplicate);
  j.field("completions_foreign", c.completions_foreign);
  j.field("completions_unknown", c.completions_unknown);
  j.field("failure_reports", c.failure_reports);
  j.field("jobs_failed", c.jobs_failed);
  j.field("nonfinite_losses", c.nonfinite_losses);
  j.field("cuts", c.cuts);
  j.field("restores", c.restores);
  j.field("jobs_withdrawn", c.jobs_withdrawn);
  j.field("leases_voided", c.leases_voided);
  j.end_object();

  j.field("generation", run.generation());
  j.key("group");
  if (run.group().empty()) {
    j.null();
  } else {
    j.value(run.group());
  }
  j.key("cuts").begin_object();
  uint64_t complete = 0;
  for (const Cut& cut : run.cuts()) complete += cut.complete();
  j.field("count", complete);
  j.field("keep", static_cast<uint64_t>(run.config().keep_cuts));
  j.key("latest");
  if (const Cut* latest = run.latest_cut()) {
    write_cut(j, *latest, now);
  } else {
    j.null();
  }
  j.end_object();

  constexpr size_t kEventsShown = 50;
  const auto& events = run.events();
  j.key("events").begin_array();
  for (size_t i = events.size() > kEventsShown ? events.size() - kEventsShown : 0;
       i < events.size(); ++i) {
    const Event& e = events[i];
    j.begin_object();
    j.field("seq", e.seq);
    j.field("ago_ms", now - e.time);
    j.field("kind", event_kind_name(e.kind));
    j.field("text", e.text);
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

void write_run_summary(JsonWriter& j, const Run& run, TimeMs now) {
  const Progress p = progress_of(run, now);
  j.begin_object();
  j.field("run", run.config().name);
  j.field("state", run_state_name(run.state()));
  j.field("reason", run.state_reason());
  j.field("mode", schedule_mode_name(run.mode()));
  const Epoch* current = nullptr;
  for (const Epoch& e : run.epochs()) {
    if (!e.closed()) current = current ? current : &e;
  }
  j.key("epoch");
  if (current) {
    j.value(current->plan.epoch);
  } else {
    j.null();
  }
  j.field("target_epoch", run.plan().target_epoch);
  j.field("jobs_planned", p.planned);
  j.field("jobs_done", p.done);
  uint64_t active = 0;
  for (const WorkerInfo& w : run.workers()) active += w.active ? 1 : 0;
  j.field("workers_active", active);
  j.end_object();
}

void write_cut(JsonWriter& j, const Cut& c, TimeMs now) {
  j.begin_object();
  j.field("id", c.id);
  j.field("group", c.group);
  j.field("seq", c.seq);
  j.field("generation", c.generation);
  j.field("complete", c.complete());
  j.field("world_size", static_cast<uint64_t>(c.world_size));
  j.key("ranks").begin_array();
  for (uint32_t rank : c.ranks) j.value(static_cast<uint64_t>(rank));
  j.end_array();
  j.field("created_ago_ms", now - c.created_at);
  j.key("completed_ago_ms");
  if (c.completed_at) {
    j.value(now - *c.completed_at);
  } else {
    j.null();
  }
  if (c.complete()) {
    const RunProgress& p = c.saved;
    j.field("state", run_state_name(p.state));
    const Epoch* latest = p.epochs.empty() ? nullptr : &p.epochs.back();
    for (const Epoch& e : p.epochs) {
      if (!e.closed()) {
        latest = &e;
        break;
      }
    }
    if (latest != nullptr) {
      j.field("epoch", latest->plan.epoch);
      j.field("set", set_name(latest->plan.set));
    }
    j.field("jobs_done", c.jobs_done);
    j.field("partial_jobs", c.partial_jobs);
    j.field("partial_batches", c.partial_batches);
  }
  j.end_object();
}

void write_rendezvous(JsonWriter& j, const Rendezvous& rdzv, TimeMs now) {
  j.begin_object();
  j.field("round", rdzv.round());
  j.field("formed", rdzv.formed());
  j.field("min_nodes", static_cast<uint64_t>(rdzv.min_nodes()));
  j.field("max_nodes", static_cast<uint64_t>(rdzv.max_nodes()));
  j.field("settle_ms", rdzv.settle_ms());
  j.field("node_timeout_ms", rdzv.node_timeout_ms());
  // The running round's layout, as it formed (a member that left stays in it).
  j.key("members").begin_array();
  for (const Rendezvous::Member& m : rdzv.members()) j.value(m.name);
  j.end_array();
  if (rdzv.formed()) {
    uint64_t world_size = 0;
    for (const Rendezvous::Member& m : rdzv.members()) world_size += m.nproc;
    j.field("world_size", world_size);
    j.field("master_addr", rdzv.master_addr());
    j.field("master_port", static_cast<uint64_t>(rdzv.master_port()));
  }
  // (never a node's secret, nor its hash)
  j.key("nodes").begin_array();
  for (const Rendezvous::Node& n : rdzv.nodes()) {
    j.begin_object();
    j.field("name", n.name).field("addr", n.addr).field("nproc", static_cast<uint64_t>(n.nproc));
    j.field("round", n.round).field("last_seen_ago_ms", now - n.last_seen);
    j.end_object();
  }
  j.end_array();
  j.field("last_end", rdzv.last_end());
  j.end_object();
}

void write_epochs_page(JsonWriter& j, const Run& run, std::pair<size_t, size_t> range, TimeMs now,
                       int64_t wall_now_ms) {
  const auto& epochs = run.epochs();
  j.begin_object().field("run", run.config().name).field("generation", run.generation());
  j.field("epochs_total", static_cast<uint64_t>(epochs.size()));
  j.field("epochs_from", static_cast<uint64_t>(range.first));
  j.key("epochs").begin_array();
  for (size_t i = range.first; i < range.second; ++i) {
    write_epoch(j, epochs[i], now, wall_now_ms);
  }
  j.end_array().end_object();
}

}  // namespace traincoord
