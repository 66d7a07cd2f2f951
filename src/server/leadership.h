// Whether this coordinator leads its runs (high availability, docs/HA.md), shared by the thread
// that campaigns and keeps the etcd lease alive, the engine thread (which answers 421
// not_leader while it does not lead) and the commit thread (which steps down when etcd refuses
// a write). Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

namespace traincoord {

class Leadership {
 public:
  explicit Leadership(std::string advertised_url) : advertised_(std::move(advertised_url)) {}
  // (Once the port is known, before anyone leads.)
  void set_advertised_url(std::string url) {
    std::lock_guard lock(mu_);
    advertised_ = std::move(url);
  }

  struct View {
    bool leading = false;
    int64_t term = 0;    // of the leader known (0: none known: an election is due)
    std::string leader;  // its advertised URL
  };
  View view() const {
    std::lock_guard lock(mu_);
    return view_;
  }
  std::string advertised_url() const {
    std::lock_guard lock(mu_);
    return advertised_;
  }

  // This coordinator leads, from `term` on.
  void lead(int64_t term) {
    std::lock_guard lock(mu_);
    view_ = {true, term, advertised_};
  }
  // Another leads (`term` 0: no one known). Ignored while this one leads: only step_down ends that.
  void follow(int64_t term, std::string leader) {
    std::lock_guard lock(mu_);
    if (view_.leading) return;
    view_ = {false, term, std::move(leader)};
  }
  // Ends this coordinator's leadership (a write refused, the lease lost): from now on nothing is
  // written or answered under it. Returns false when it did not lead.
  bool step_down(const std::string& why) {
    {
      std::lock_guard lock(mu_);
      if (!view_.leading) return false;
      view_ = {false, 0, {}};
      why_ = why;
      changed_ += 1;
    }
    cv_.notify_all();
    return true;
  }
  // The process is asked to stop (a signal).
  void request_stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      changed_ += 1;
    }
    cv_.notify_all();
  }
  bool stop_requested() const {
    std::lock_guard lock(mu_);
    return stop_;
  }
  // Waits at most `for_at_most` for a step-down or a stop (returns at once if one came since
  // `*seen`, which it updates). Returns why it stepped down, empty otherwise.
  std::string wait(uint64_t* seen, std::chrono::milliseconds for_at_most) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, for_at_most, [&] { return changed_ != *seen; });
    *seen = changed_;
    std::string why = std::move(why_);
    why_.clear();
    return why;
  }

 private:
  std::string advertised_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  View view_;
  std::string why_;
  bool stop_ = false;
  uint64_t changed_ = 0;
};

}  // namespace traincoord
