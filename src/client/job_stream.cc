// The prefetching job loop (JobStream) and the sample order of the C++ client.
#include <algorithm>
#include <stdexcept>

#include "client/reply.h"
#include "client/stream_round.h"
#include "client/wire.h"
#include "core/sample_order.h"
#include "json/json_writer.h"
#include "traincoord/client.h"

namespace traincoord::client {

namespace {

uint64_t next_request_id() {
  static std::atomic<uint64_t> counter{
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  return (counter.fetch_add(0x9e3779b97f4a7c15ULL) >> 12) | 1;  // nonzero, exact as a double
}

}  // namespace

JobStream::JobStream(Worker& worker, size_t depth) : worker_(worker), depth_(depth) {
  if (depth < 1 || depth > 64) throw std::invalid_argument("JobStream depth must be 1 to 64");
  thread_ = std::thread([this] { loop(); });
}

JobStream::~JobStream() { (void)close(); }

Result<std::optional<Job>> JobStream::next() {
  std::unique_lock lock(mu_);
  if (ready_.empty() && !finished_ && !error_ && !closing_) {
    waiting_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return !ready_.empty() || finished_ || error_ || closing_; });
    waiting_ = false;
  }
  if (error_) return tl::unexpected(*error_);
  if (ready_.empty()) return std::optional<Job>();
  Job job = std::move(ready_.front());
  ready_.pop_front();
  cv_.notify_all();  // room for one more ahead
  return std::optional<Job>(std::move(job));
}

void JobStream::complete(const Job& job, const Completion& completion) {
  std::lock_guard lock(mu_);
  outbox_.emplace_back(job, completion);
  dry_ = false;  // a completion may open the next epoch
  cv_.notify_all();
}

std::vector<Completed> JobStream::outcomes() const {
  std::lock_guard lock(mu_);
  return outcomes_;
}

Result<void> JobStream::flush() {
  std::unique_lock lock(mu_);
  cv_.notify_all();
  cv_.wait(lock, [this] { return (outbox_.empty() && sending_ == 0) || error_ || closed_; });
  if (error_) return tl::unexpected(*error_);
  if (!outbox_.empty()) {  // completions queued after close(): nothing sends them any more
    return tl::unexpected(ClientError{
        0, "invalid_argument", "the stream is closed: complete jobs through the worker", {}});
  }
  return {};
}

Result<CutShareTaken> JobStream::give_cut_share(const CutShare& share) {
  if (auto flushed = flush(); !flushed) return tl::unexpected(flushed.error());
  return worker_.give_cut_share(share);
}

Result<void> JobStream::close() {
  std::vector<Job> unused;
  {
    std::lock_guard lock(mu_);
    if (closed_) return error_ ? Result<void>(tl::unexpected(*error_)) : Result<void>();
    closed_ = closing_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  unused.assign(ready_.begin(), ready_.end());
  ready_.clear();
  if (!unused.empty()) {
    if (auto r = worker_.release(unused); !r && !error_) error_ = r.error();
  }
  if (error_) return tl::unexpected(*error_);
  return {};
}

StreamState JobStream::state() const {
  return {depth_, ready_.size(), outbox_.size(), waiting_, dry_, closing_ || finished_};
}

bool JobStream::has_work() const {
  if (error_) return false;
  return client::has_work(state());
}

void JobStream::loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return has_work() || closing_ || error_; });
    if (!has_work()) return;  // closing (or failed), and every completion was sent
    const size_t take = std::min<size_t>(outbox_.size(), 64);
    std::vector<std::pair<Job, Completion>> done(outbox_.begin(), outbox_.begin() + take);
    outbox_.erase(outbox_.begin(), outbox_.begin() + take);
    sending_ = done.size();
    StreamState now = state();
    now.completions = done.size();
    const StreamRound round = plan_round(now);
    const size_t need = round.jobs;
    const bool long_poll = round.long_poll;
    lock.unlock();

    // The worker is ours alone while the stream is open (see the header).
    Result<std::vector<Job>> got = std::vector<Job>();
    bool wait_reply = false;
    if (!done.empty()) {
      JsonWriter j;
      wire::begin_request(j, worker_.id_.load(), worker_.options_.group)
          .key("completions")
          .begin_array();
      for (const auto& [job, c] : done) {
        worker_.drop(job.lease);
        wire::write_completion(j, job, c);
      }
      j.end_array();
      if (need > 0) {
        j.field("next", true).field("wait_ms", 0).field("request", next_request_id());
        j.field("jobs", static_cast<uint64_t>(need));
      }
      j.end_object();
      auto reply = worker_.call("complete", j.str(), std::chrono::milliseconds(0));
      if (!reply && reply::forgotten(reply.error())) {
        // The coordinator restarted without its state: it knows none of these leases (or us);
        // the jobs will be handed out again.
        worker_.last_outcomes_.assign(done.size(), Completed{"lost", false});
        if (reply::unregistered(reply.error())) {
          if (auto r = worker_.register_worker(); !r) got = tl::unexpected(r.error());
        }
      } else if (!reply) {
        got = tl::unexpected(reply.error());
      } else if (need > 0) {
        got = worker_.take_jobs(*reply, true, done.size());
      } else {
        auto outcomes =
            reply::completion(*reply, true, done.size(), false, worker_.request_name("complete"));
        if (outcomes) {
          worker_.last_outcomes_ = std::move(outcomes->outcomes);
        } else {
          got = tl::unexpected(outcomes.error());
        }
      }
    } else if (need > 0) {
      JsonWriter j;
      const auto wait = long_poll ? worker_.options_.long_poll : std::chrono::milliseconds(0);
      wire::begin_request(j, worker_.id_.load(), worker_.options_.group)
          .field("wait_ms", wait.count())
          .field("request", next_request_id())
          .field("jobs", static_cast<uint64_t>(need))
          .end_object();
      auto reply = worker_.call("acquire", j.str(), wait);
      if (!reply && reply::unregistered(reply.error())) {
        auto r = worker_.register_worker();  // the coordinator restarted without us: ask again
        got = r ? Result<std::vector<Job>>(std::vector<Job>()) : tl::unexpected(r.error());
      } else {
        got = reply ? worker_.take_jobs(*reply, false, 0) : tl::unexpected(reply.error());
      }
    }
    if (!got && got.error().code == "wait") {
      wait_reply = true;
      got = std::vector<Job>();
    }

    lock.lock();
    sending_ = 0;
    if (!done.empty() && got && worker_.last_outcomes_.size() == done.size()) {
      outcomes_.insert(outcomes_.end(), worker_.last_outcomes_.begin(),
                       worker_.last_outcomes_.end());
    }
    if (!got) {
      error_ = got.error();
      cv_.notify_all();
      return;
    }
    for (Job& job : *got) ready_.push_back(std::move(job));
    if (worker_.finished_) finished_ = true;
    if (need > 0 && !long_poll) dry_ = wait_reply && got->empty();
    cv_.notify_all();
  }
}

SampleOrder::SampleOrder(uint64_t samples, uint64_t batch_size, uint64_t seed,
                         const std::string& set, Shuffle shuffle) {
  if (set != "train" && set != "dev") {
    throw std::invalid_argument("SampleOrder: set must be \"train\" or \"dev\", not \"" + set +
                                "\"");
  }
  if (batch_size == 0) throw std::invalid_argument("SampleOrder: batch_size must be at least 1");
  const SampleShuffle kind = shuffle == Shuffle::kEpoch   ? SampleShuffle::kEpoch
                             : shuffle == Shuffle::kFixed ? SampleShuffle::kFixed
                                                          : SampleShuffle::kNone;
  order_ = std::make_shared<const traincoord::SampleOrder>(
      samples, batch_size, seed, set == "train" ? SetKind::kTrain : SetKind::kDev, kind);
}

uint64_t SampleOrder::batches() const {
  return static_cast<const traincoord::SampleOrder*>(order_.get())->batches();
}

std::vector<uint64_t> SampleOrder::batch(int64_t epoch, uint64_t batch) const {
  const auto* order = static_cast<const traincoord::SampleOrder*>(order_.get());
  if (batch >= order->batches()) {
    throw std::out_of_range("batch " + std::to_string(batch) + " is outside the set's " +
                            std::to_string(order->batches()) + " batches");
  }
  std::vector<uint64_t> out;
  order->batch(epoch, batch, &out);
  return out;
}

std::vector<std::vector<uint64_t>> SampleOrder::samples_of(const Job& job) const {
  std::vector<std::vector<uint64_t>> out;
  for (uint64_t b : job.batches) out.push_back(batch(job.epoch, b));
  return out;
}

}  // namespace traincoord::client
