#include "sim/simulation.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <sstream>

#include "json/json_writer.h"

#include "core/clock.h"

namespace traincoord {

std::string_view completion_order_name(CompletionOrder order) {
  return enum_name(kCompletionOrderNames, order);
}

std::optional<CompletionOrder> parse_completion_order(std::string_view name) {
  return parse_enum<CompletionOrder>(kCompletionOrderNames, name);
}

double LossTable::loss(SetKind set, int64_t epoch) const {
  auto it = by_epoch.find({set, epoch});
  return it == by_epoch.end() ? constant : it->second;
}

Result<LossTable> parse_loss_table(std::string_view text, std::string_view source) {
  LossTable table;
  std::istringstream in{std::string(text)};
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string set, extra;
    int64_t epoch = 0;
    double loss = 0;
    if (!(fields >> set)) continue;  // blank line
    const std::string where = std::string(source) + ":" + std::to_string(number) + ": ";
    if (set != "train" && set != "dev") {
      return invalid_argument("losses", where + "expected 'train' or 'dev', got '" + set + "'");
    }
    if (!(fields >> epoch >> loss) || (fields >> extra)) {
      return invalid_argument("losses", where + "expected 'SET EPOCH LOSS', e.g. 'dev 3 0.82'");
    }
    table.by_epoch[{set == "train" ? SetKind::kTrain : SetKind::kDev, epoch}] = loss;
  }
  return table;
}

Result<SimulationResult> simulate(const RunConfig& config, const SimulationOptions& options) {
  if (options.workers < 1) return invalid_argument("workers", "--workers must be at least 1");
  if (auto ok = validate(config); !ok) return tl::unexpected(ok.error());
  ManualClock clock;  // simulated time stands still: no lease ever expires in a dry run
  Run run(config, clock);
  std::mt19937_64 rng(options.seed);

  SimulationResult result;
  result.config = config;
  result.plan = run.plan();
  result.planned_jobs = run.planned_jobs();

  struct Holding {
    WorkerId worker;
    Job job;
  };
  std::vector<Holding> holding;  // in hand-out order
  std::vector<WorkerId> waiting;
  std::vector<WorkerId> ids;
  for (int i = 0; i < options.workers; ++i) ids.push_back(run.join("w" + std::to_string(i)));

  auto take = [&](WorkerId w, const Acquired& a) {
    if (a.status == AcquireStatus::kJob) {
      Handout h;
      h.step = result.handouts.size() + 1;
      h.worker = run.workers()[w].name;
      h.job = a.job;
      run.batches_of(a.job, &h.batches);
      result.handouts.push_back(std::move(h));
      holding.push_back({w, a.job});
    } else if (a.status == AcquireStatus::kWait) {
      waiting.push_back(w);
    }
  };
  for (WorkerId w : ids) take(w, *run.acquire(w));

  while (!holding.empty()) {
    size_t pick = 0;
    switch (options.order) {
      case CompletionOrder::kFifo:
        pick = 0;
        break;
      case CompletionOrder::kLifo:
        pick = holding.size() - 1;
        break;
      case CompletionOrder::kRandom:
        pick = std::uniform_int_distribution<size_t>(0, holding.size() - 1)(rng);
        break;
    }
    const Holding h = holding[pick];
    holding.erase(holding.begin() + static_cast<std::ptrdiff_t>(pick));
    Completion c;
    c.loss = options.losses.loss(h.job.set, h.job.epoch);
    // Up to 2^36 batches of up to 2^50 samples: saturate rather than wrap.
    if (__builtin_mul_overflow(h.job.positions.count, std::max<uint64_t>(1, config.batch_size),
                               &c.samples)) {
      c.samples = std::numeric_limits<uint64_t>::max();
    }
    auto next = run.next_job(h.worker, h.job.lease, c);
    TC_ASSERT(next.has_value() && next->completed.counted());
    take(h.worker, next->next);
    std::vector<WorkerId> retry;
    retry.swap(waiting);
    for (WorkerId w : retry) take(w, *run.acquire(w));
  }
  TC_ASSERT(run.finished());  // with no lease out, a running run would always have work

  result.events.assign(run.events().begin(), run.events().end());
  result.epochs = run.epochs();
  result.state = run.state();
  result.reason = run.state_reason();
  result.early_stop = run.early_stop().state();
  return result;
}

namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string batch_list(const std::vector<uint64_t>& batches) {
  bool consecutive = batches.size() > 2;
  for (size_t i = 1; consecutive && i < batches.size(); ++i) {
    consecutive = batches[i] == batches[i - 1] + 1;
  }
  if (consecutive) {
    return "[" + std::to_string(batches.front()) + ".." + std::to_string(batches.back()) + "]";
  }
  std::string s = "[";
  for (size_t i = 0; i < batches.size(); ++i) s += (i ? "," : "") + std::to_string(batches[i]);
  return s + "]";
}

std::string validated_epochs(const SimulationResult& r) {
  std::string s;
  int shown = 0;
  for (int64_t e = r.plan.start_epoch; e < r.plan.end_epoch; ++e) {
    if (!dev_epoch_plan(r.plan, r.config, e)) continue;
    if (shown++ == 12) return s + ", ...";
    s += (s.empty() ? "" : ", ") + std::to_string(e);
  }
  return s.empty() ? "never" : s;
}

}  // namespace

void print_report(const SimulationResult& r, const SimulationOptions& o, std::ostream& out) {
  const Plan& p = r.plan;
  out << "run " << r.config.name << ": " << o.workers << " simulated workers, completion order "
      << completion_order_name(o.order) << (r.config.seed_compat ? ", seed_compat" : "")
      << (r.config.overlap_epochs ? ", overlap_epochs" : "") << "\n";
  out << "plan: batches_per_job " << p.batches_per_job << ", batches_per_step "
      << p.batches_per_step << ", steps_per_epoch " << p.steps_per_epoch << "\n";
  out << "      start epoch " << p.start_epoch << " (step " << r.config.start_step << ", "
      << p.jobs_trained << " jobs of it already trained), target epoch " << p.target_epoch << "\n";
  out << "      train: " << r.config.train_batches << " batches, " << p.train_jobs_per_epoch
      << " jobs per epoch; dev: " << r.config.dev_batches << " batches, " << p.dev_jobs_per_epoch
      << " jobs per epoch\n";
  out << "      validation after epochs: " << validated_epochs(r) << "\n";
  out << "      jobs planned: " << r.planned_jobs << "\n\n";
  out << "hand-outs (step worker set epoch job/jobs-in-epoch batches):\n";
  for (const Handout& h : r.handouts) {
    out << "  " << h.step << " " << h.worker << " " << set_name(h.job.set) << " " << h.job.epoch
        << " " << h.job.index << "/" << h.job.jobs_in_epoch << " " << batch_list(h.batches) << "\n";
  }
  out << "\nepochs:\n";
  for (const Epoch& e : r.epochs) {
    out << "  " << set_name(e.plan.set) << " " << e.plan.epoch << ": "
        << (e.closed() ? "loss " + number(e.loss) : std::string("not finished")) << " (" << e.done
        << " jobs";
    if (e.plan.first_job > 0) out << ", from job " << e.plan.first_job;
    if (e.nonfinite_jobs > 0) out << ", " << e.nonfinite_jobs << " non-finite";
    out << ")\n";
  }
  out << "\nresult: " << run_state_name(r.state) << ": " << r.reason << "\n";
  if (r.early_stop.best_epoch) {
    out << "best dev epoch: " << *r.early_stop.best_epoch << " (" << number(r.early_stop.best_value)
        << ")\n";
  }
}

std::string trace_json(const SimulationResult& r, const SimulationOptions& o) {
  JsonWriter w;
  auto optional = [&](const std::optional<int64_t>& v) {
    if (v) {
      w.value(*v);
    } else {
      w.null();
    }
  };
  const Plan& p = r.plan;
  w.begin_object();
  w.field("run", r.config.name)
      .field("workers", o.workers)
      .field("order", completion_order_name(o.order));
  w.key("plan").begin_object();
  w.field("batches_per_job", p.batches_per_job).field("batches_per_step", p.batches_per_step);
  w.field("steps_per_epoch", p.steps_per_epoch).field("start_epoch", p.start_epoch);
  w.field("jobs_trained", p.jobs_trained).field("target_epoch", p.target_epoch);
  w.field("train_jobs_per_epoch", p.train_jobs_per_epoch);
  w.field("dev_jobs_per_epoch", p.dev_jobs_per_epoch).field("planned_jobs", r.planned_jobs);
  w.end_object();
  w.key("handouts").begin_array();
  for (const Handout& h : r.handouts) {
    w.begin_object().field("step", h.step).field("worker", h.worker).field("lease", h.job.lease);
    w.field("set", set_name(h.job.set)).field("epoch", h.job.epoch).field("job", h.job.index);
    w.field("jobs_in_epoch", h.job.jobs_in_epoch).key("batches").begin_array();
    for (uint64_t b : h.batches) w.value(b);
    w.end_array().end_object();
  }
  w.end_array();
  w.key("epochs").begin_array();
  for (const Epoch& e : r.epochs) {
    w.begin_object().field("set", set_name(e.plan.set)).field("epoch", e.plan.epoch);
    w.field("first_job", e.plan.first_job).field("end_job", e.plan.end_job);
    w.field("done", e.done).field("closed", e.closed()).key("loss");
    w.value(e.closed() ? e.loss : std::nan(""));  // null when not closed or not finite
    w.field("nonfinite_jobs", e.nonfinite_jobs).end_object();
  }
  w.end_array();
  w.key("events").begin_array();
  for (const Event& e : r.events) {
    w.begin_object().field("seq", e.seq).field("kind", event_kind_name(e.kind));
    w.field("text", e.text).end_object();
  }
  w.end_array();
  w.key("result").begin_object();
  w.field("state", run_state_name(r.state)).field("reason", r.reason);
  w.field("early_stopped", r.early_stop.stopped).key("stopped_at_epoch");
  optional(r.early_stop.stopped_at_epoch);
  w.key("best_epoch");
  optional(r.early_stop.best_epoch);
  w.field("best_value", r.early_stop.best_value);
  w.end_object().end_object();
  return w.str() + "\n";
}

}  // namespace traincoord
