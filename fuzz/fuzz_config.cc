// libFuzzer target: the run config parsers (TOML files, JSON bodies of POST /v1/runs), and what
// a server does next with a config they accept: plan it, and run it. An accepted config must
// plan and run without breaking an invariant (a broken one aborts, and libFuzzer reports the
// input), so each one is planned and run for a few steps of a small simulation: two workers
// take jobs, complete them, let leases expire, fail one, and the run is saved and restored.
// What either parser accepts has a run name that is a safe path segment and a monitor that is
// valid text.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "config/config_file.h"
#include "core/clock.h"
#include "core/plan.h"
#include "core/run.h"
#include "core/run_codec.h"
#include "core/user_text.h"

namespace {

using namespace traincoord;

void check_text(const RunConfig& config) {
  if (!validate_run_name(config.name)) std::abort();
  const std::string& monitor = config.early_stop.patience.monitor;
  if (!monitor.empty() && !validate_text("monitor", monitor, 64)) std::abort();
}

void run_a_few_steps(const RunConfig& config, uint8_t choices) {
  check_text(config);
  ManualClock clock;
  Run run(config, clock);
  (void)run.planned_jobs();
  const WorkerId workers[] = {run.join("a"), run.join("b")};
  std::vector<uint64_t> batches;
  for (int step = 0; step < 48 && !run.finished(); ++step) {
    const WorkerId w = workers[step % 2];
    auto got = run.acquire(w, 0, 1 + (choices & 1));
    if (!got || got->status != AcquireStatus::kJob) {
      clock.advance(config.lease_timeout_ms + 1);  // whatever is out expires
      run.expire_leases();
      continue;
    }
    batches.clear();
    run.batches_of(got->job, &batches);
    Completion done;
    done.loss = step % 7 == 3 ? 1e300 : 0.5 * step;
    done.samples = step % 5 == 1 ? uint64_t{1} << 62 : got->job.positions.count;
    // The outcomes of these calls are not checked (refusals are expected answers to random
    // steps): what is checked is that no step breaks an invariant of the run.
    if ((choices >> 1) % 4 == step % 4) {
      (void)run.fail(w, got->job.lease, "fuzz");
    } else {
      (void)run.complete(w, got->job.lease, done);
    }
    if (step % 11 == 10) (void)run.heartbeat(w);
    // got->more is left to expire.
    clock.advance(1 + (choices >> 3));
  }
  (void)run.next_index(SetKind::kTrain);
  auto restored = RunCodec::load(config, RunCodec::save(run), clock);
  if (!restored || RunCodec::save(**restored) != RunCodec::save(run)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const uint8_t choices = size > 0 ? data[size - 1] : 0;
  if (auto c = traincoord::parse_run_config(text, "fuzz.toml")) run_a_few_steps(*c, choices);
  if (auto c = traincoord::parse_run_config_json(text, "fuzz.json")) run_a_few_steps(*c, choices);
  return 0;
}
