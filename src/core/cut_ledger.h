// The ledger of a run's checkpoint cuts (docs/SEMANTICS.md, "Checkpoint cuts"). Every rank
// of a group gives its share of the group's seq-th cut (the jobs it holds partly trained);
// once every rank has given its share the cut is complete and holds the run's progress as of
// then, which a later group restores. Pure, as the rest of core/: Run (core/run.h) checks a
// share against its workers, leases and groups, and asks the ledger for the rest.
//
// Paired assertions (as TigerBeetle pairs its codecs): what a complete cut promises of the
// progress it saved (broken_promise) is asserted when the cut completes, checked of every cut a
// snapshot holds (RunCodec::inconsistency, on save and on load), and asserted again of the run
// as a restore of the cut leaves it, together with the figures the cut saved
// (assert_restored).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "core/run_progress.h"

namespace traincoord {

// A rank's job partly trained when it gave its share of a cut: the first `batches` batches of
// the job as it was handed out are in the checkpointed model, with the aggregates `completion`.
struct CutPart {
  LeaseId lease = 0;
  uint64_t batches = 0;
  Completion completion;
};

struct Cut {
  uint64_t id = 0;  // 1, 2, 3, ... per run
  std::string group;
  uint64_t seq = 0;  // the group's seq-th cut (each rank counts its own calls)
  uint64_t generation = 0;
  uint32_t world_size = 0;
  std::vector<uint32_t> ranks;  // the ranks that gave their share, sorted
  TimeMs created_at = 0;
  std::optional<TimeMs> completed_at;  // complete once every rank of world_size gave its share
  // The shares' partly trained jobs, as (epoch slot, position, part) until complete.
  struct Share {
    uint32_t epoch_slot = 0;
    uint64_t position = 0;
    uint64_t batches = 0;
    Completion completion;
  };
  std::vector<Share> shares;
  RunProgress saved;  // when complete: the run as of the cut
  // When complete, for status: completed jobs, partly trained jobs and their trained batches.
  uint64_t jobs_done = 0;
  uint64_t partial_jobs = 0;
  uint64_t partial_batches = 0;
  bool complete() const { return completed_at.has_value(); }
};

struct CutShareReply {
  uint64_t cut = 0;
  bool complete = false;
  std::vector<uint32_t> ranks;
  uint32_t world_size = 0;
};

class CutLedger {
 public:
  // Pending cuts kept at most (shares that never completed: the oldest is dropped).
  static constexpr size_t kPendingKept = 16;

  // `keep_complete`: how many complete cuts are kept (the latest ones). `batches_per_job`: of
  // the run's plan; a partly trained job is short of its job_batches().
  CutLedger(uint32_t keep_complete, uint64_t batches_per_job)
      : keep_complete_(keep_complete), batches_per_job_(batches_per_job) {}

  // Oldest first: the complete cuts kept, and the pending cuts of the current group.
  const std::deque<Cut>& cuts() const { return cuts_; }
  const Cut* find(uint64_t id) const;
  const Cut* latest() const;  // the latest complete cut, or nullptr
  static CutShareReply reply_of(const Cut& cut) {
    return CutShareReply{cut.id, cut.complete(), cut.ranks, cut.world_size};
  }

  // ---- a share, in three steps: check_share, check_part for each part, add_share ----
  // Rank `rank` of `world_size` gives its share of `group`'s `seq`-th cut. Returns the reply
  // to give when the rank gave that share already (a repeat changes nothing), or nullopt when
  // the share is new. Fails (cut_mismatch) when the cut has another world size.
  Result<std::optional<CutShareReply>> check_share(std::string_view group, uint64_t seq,
                                                   uint32_t rank, uint32_t world_size) const;
  // Fails (lease_not_held) when another rank's share of `group`'s `seq`-th cut has the job at
  // (`epoch_slot`, `position`) already: its lease there expired and the job came to `lease`,
  // and the two trained parts would overlap.
  Result<void> check_part(std::string_view group, uint64_t seq, LeaseId lease, uint32_t epoch_slot,
                          uint64_t position) const;
  // Records the share. The group's first share of `seq` opens a pending cut at `generation`
  // (dropping the oldest pending cut when kPendingKept are pending). Returns the cut; once it
  // has all world_size ranks, complete() it. REQUIRES: check_share found the share new, and
  // check_part accepted each of `shares`.
  Cut& add_share(std::string_view group, uint64_t seq, uint64_t generation, uint32_t rank,
                 uint32_t world_size, std::vector<Cut::Share> shares, TimeMs now);
  // Completes `cut`: saves `progress` (the run now, leases and all) with every job in flight
  // open again and the shares' trained batches folded in, and asserts the cut's promise.
  // Returns how many non-finite losses the shares folded in. REQUIRES: `cut` has all its ranks
  // and is not complete.
  uint64_t complete(Cut& cut, RunProgress progress, TimeMs now);
  // Drops the oldest complete cuts beyond keep_complete. References to cuts may dangle after.
  void keep_latest();
  // A new group took over: the pending cuts of the group before can complete no more.
  void drop_pending();
  // Whether cut `id` can be restored: fails (cut_not_found, naming the cuts kept) when the
  // ledger has no such cut, or (cut_incomplete) when not every rank gave its share. `run`: the
  // run's name, for the message.
  Result<void> check_restorable(uint64_t id, std::string_view run) const;
  // A restore of cut `id`: the cuts after it belong to the lineage the restore abandons (none is
  // restored again, and they would push `id` out of the cuts kept); drops them. Returns the cut,
  // whose `saved` progress the run takes on; then assert_restored(). REQUIRES: find(id) is
  // complete.
  const Cut& restore(uint64_t id);

  // ---- the promise of a complete cut ----
  // What `cut` breaks of its promise about the progress it saved, or empty when it keeps it:
  // its jobs_done is the sum of its epochs' done, its partial jobs and batches are within
  // what its epochs hold partly trained; no lease survives in it; every open epoch accounts for
  // each job below its cursor (done, failed or active) and has every active job queued again;
  // every partly trained job is active and short of whole; the aggregates count at least every
  // counted and every partly trained job; the running epochs are the open ones; a run stopped
  // early has early stopping stopped, which observed no more dev epochs than closed.
  std::string broken_promise(const Cut& cut) const;
  // Asserts (stopping the program as TC_ASSERT does) that `restored`, the run's progress as a
  // restore of `cut` left it, keeps the cut's promise and is what the cut saved: the same jobs
  // done in all (cut.jobs_done), per epoch the same counts, aggregates, failed jobs and partly
  // trained batches, the same schedule, early stopping and run state.
  void assert_restored(const Cut& cut, const RunProgress& restored) const;
  // What invariant the ledger breaks, or empty: cuts in id order, ranks sorted and within their
  // world size, complete exactly when every rank gave its share (then no share pending, and the
  // promise kept), pending only for `group` (the current one), shares of the `epochs` the run
  // has. RunCodec checks it of what it saves and of what it loads.
  std::string inconsistency(std::string_view group, size_t epochs) const;

 private:
  friend class RunCodec;  // run_codec.cc: saves and restores the cuts with the run

  // What `cut` breaks of its promise about `progress` (its own saved progress, or the run's as
  // a restore of it left it).
  std::string broken_promise(const Cut& cut, const RunProgress& progress) const;
  Cut* find_share(std::string_view group, uint64_t seq);
  const Cut* find_share(std::string_view group, uint64_t seq) const;

  uint32_t keep_complete_;
  uint64_t batches_per_job_;
  std::deque<Cut> cuts_;
  uint64_t last_id_ = 0;
};

}  // namespace traincoord
