// Step mode: what W ranks parked at an epoch's end cost the coordinator (docs/PERFORMANCE.md,
// "Step mode: the coordinator's own cost"). The Coordinator alone (no sockets, no journal, a
// clock that stands still: no tick), one request per wave, as a lightly loaded server takes
// them. A step-mode run of W ranks, `k` batches per rank per epoch; at each epoch's end every
// rank does what Phases' feed does: it reports its batches with a request for its next ones
// (`next`, no wait: answered "wait", the epoch is not done), then long-polls an acquire, which
// parks; the last rank's report closes the epoch, the next opens, and every parked acquire is
// answered. Printed per epoch boundary: the parked acquires' retries (Coordinator's count), and
// the engine time of the boundary's waves (the reports, the long polls and the retries), beside
// the same requests without long polls (the acquire answered "wait" at once, and asked again
// once the next epoch is open): what the parking adds.
//
//   build/parked_bench [W ...]            (default: 64 256 512)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/engine.h"
#include "server/coordinator.h"
#include "server/server_clock.h"

namespace traincoord {
namespace {

constexpr int kBatchesPerRank = 2;
constexpr int kBoundaries = 3;

struct Result {
  double ms_per_boundary = 0;
  double retries_per_boundary = 0;
};

class Bench {
 public:
  Bench(uint32_t ranks, bool park) : ranks_(ranks), park_(park), clock_(&wall_), engine_(clock_) {
    clock_.go_live(wall_.now());
    coordinator_ = std::make_unique<Coordinator>(engine_, clock_, nullptr, CoordinatorOptions{});
    const std::string samples = std::to_string(ranks * kBatchesPerRank);
    check(post("/v1/runs", R"({"name": "s", "data": {"train_samples": )" + samples +
                               R"(, "batch_size": 1}, "schedule": {"epochs": )" +
                               std::to_string(kBoundaries + 1) +
                               R"(, "mode": "steps"}, "leases": {"timeout": 600.0}})"),
          "create");
    for (uint32_t r = 0; r < ranks; ++r) {
      check(post("/v1/runs/s/workers", R"({"name": "r)" + std::to_string(r) +
                                           R"(", "group": "g", "rank": )" + std::to_string(r) +
                                           R"(, "world_size": )" + std::to_string(ranks) + "}"),
            "register");
    }
    leases_.resize(ranks);
    for (uint32_t r = 0; r < ranks; ++r) take(r, post(acquire(r, 0)));
  }

  Result run() {
    Result result;
    double ms = 0;
    uint64_t retries = 0;
    for (int b = 0; b < kBoundaries; ++b) {
      const uint64_t retries_before = coordinator_->parked_retries();
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::optional<HttpReply>> polls(ranks_);
      for (uint32_t r = 0; r < ranks_; ++r) {
        std::string completions;
        for (uint64_t lease : leases_[r]) {
          completions += (completions.empty() ? "" : ",") + std::string(R"({"lease": )") +
                         std::to_string(lease) + R"(, "loss": 1, "samples": 1})";
        }
        leases_[r].clear();
        std::optional<HttpReply> next = post(
            "/v1/runs/s/complete", R"({"worker": )" + std::to_string(r) + R"(, "completions": [)" +
                                       completions + R"(], "next": true, "jobs": )" +
                                       std::to_string(kBatchesPerRank) + R"(, "wait_ms": 0})");
        check(next, "complete");
        if (next->body.find(R"("status":"job")") != std::string::npos) {
          take_next(r, *next);  // (the last rank: its report opened the next epoch)
          continue;
        }
        if (park_) {
          send(acquire(r, 60'000), &polls[r]);
        } else {
          check(post(acquire(r, 0)), "acquire");  // "wait"
        }
      }
      for (uint32_t r = 0; r < ranks_; ++r) {
        if (!leases_[r].empty()) continue;
        if (park_) {
          if (!polls[r]) {
            std::fprintf(stderr, "rank %u's long poll was not answered\n", r);
            std::exit(1);
          }
          take(r, *polls[r]);
        } else {
          take(r, post(acquire(r, 0)));
        }
      }
      ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
      retries += coordinator_->parked_retries() - retries_before;
    }
    result.ms_per_boundary = ms / kBoundaries;
    result.retries_per_boundary = static_cast<double>(retries) / kBoundaries;
    return result;
  }

 private:
  static std::string acquire(uint32_t r, int wait_ms) {
    return R"({"worker": )" + std::to_string(r) + R"(, "jobs": )" +
           std::to_string(kBatchesPerRank) + R"(, "wait_ms": )" + std::to_string(wait_ms) + "}";
  }
  static void check(const std::optional<HttpReply>& reply, const char* what) {
    if (!reply || reply->status / 100 != 2) {
      std::fprintf(stderr, "%s: %s\n", what, reply ? reply->body.c_str() : "no reply");
      std::exit(1);
    }
  }
  void send(const std::string& body, std::optional<HttpReply>* answer) {
    send_to("/v1/runs/s/acquire", body, answer);
  }
  void send_to(const std::string& target, const std::string& body,
               std::optional<HttpReply>* answer) {
    std::vector<Call> calls;
    calls.push_back(Call{HttpRequest{"POST", target, body, {}},
                         ReplyTo{[answer](HttpReply r) { *answer = std::move(r); }, {}}});
    Wave wave = coordinator_->step(calls);
    for (Outgoing& o : wave.replies) o.to.respond(std::move(o.reply));
  }
  std::optional<HttpReply> post(const std::string& target, const std::string& body) {
    std::optional<HttpReply> answer;
    send_to(target, body, &answer);
    return answer;
  }
  std::optional<HttpReply> post(const std::string& body) {
    return post("/v1/runs/s/acquire", body);
  }
  // The leases of a reply's jobs ("lease":N, in order).
  void take(uint32_t r, const std::optional<HttpReply>& reply) {
    check(reply, "acquire");
    add_leases(r, reply->body);
    if (leases_[r].size() != static_cast<size_t>(kBatchesPerRank)) {
      std::fprintf(stderr, "rank %u got %zu batches: %s\n", r, leases_[r].size(),
                   reply->body.c_str());
      std::exit(1);
    }
  }
  void take_next(uint32_t r, const HttpReply& reply) {
    add_leases(r, reply.body.substr(reply.body.find(R"("next")")));
  }
  void add_leases(uint32_t r, const std::string& body) {
    for (size_t at = body.find(R"("lease":)"); at != std::string::npos;
         at = body.find(R"("lease":)", at + 1)) {
      leases_[r].push_back(std::strtoull(body.c_str() + at + 8, nullptr, 10));
    }
  }

  uint32_t ranks_;
  bool park_;
  ManualClock wall_{1'000'000};
  ServerClock clock_;
  Engine engine_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::vector<uint64_t>> leases_;
};

}  // namespace
}  // namespace traincoord

int main(int argc, char** argv) {
  std::vector<uint32_t> ranks;
  for (int i = 1; i < argc; ++i) ranks.push_back(static_cast<uint32_t>(std::atoi(argv[i])));
  if (ranks.empty()) ranks = {64, 256, 512};
  std::printf("%6s  %22s  %20s  %20s  %18s\n", "ranks", "retries per boundary",
              "engine ms (parked)", "engine ms (no poll)", "parking adds ms");
  for (uint32_t w : ranks) {
    traincoord::Bench parked(w, true), plain(w, false);
    const auto p = parked.run();
    const auto q = plain.run();
    std::printf("%6u  %22.0f  %20.2f  %20.2f  %18.2f\n", w, p.retries_per_boundary,
                p.ms_per_boundary, q.ms_per_boundary, p.ms_per_boundary - q.ms_per_boundary);
  }
  return 0;
}
