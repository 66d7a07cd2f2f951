// Helpers of the HA e2e tests (tests/etcd/): workers of a run as in-process threads that follow
// 421 not_leader to the leader named (or the next coordinator), and record what they were told;
// each coordinator's view of the runs.
#pragma once

#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "etcd/ha_http.h"

namespace traincoord::testing {

// Waits (at most 20 s) until `done` holds.
template <typename F>
inline bool eventually(F done) {
  for (int i = 0; i < 200; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// What the workers of one run saw.
struct RunLog {
  using Job = std::tuple<std::string, int64_t, int64_t>;  // set, epoch, index
  std::mutex mu;
  std::map<Job, int> accepted;  // as the workers were told
  std::set<std::string> terms;  // Traincoord-Term of the replies
  std::atomic<int> completions{0};
  std::atomic<int> misdirected{0};  // 421s and requests no coordinator answered
  std::atomic<bool> failed{false};
};

// A request as the clients make it: to the coordinator believed to lead the run; on no answer or
// 421, to the leader the 421 names or the other one, until one answers (at most 20 s).
inline Reply post(std::vector<std::string>& urls, size_t* at, const std::string& target,
                  const std::string& body, RunLog& log) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    Reply r = http(urls[*at], "POST", target, body);
    if (r.status != 0 && r.status != 421) {
      std::lock_guard lock(log.mu);
      log.terms.insert(header(r, "Traincoord-Term"));
      return r;
    }
    log.misdirected += 1;
    bool followed = false;
    if (r.status == 421) {
      rapidjson::Document d;
      d.Parse(r.body.c_str());
      const auto& leader = d["error"]["leader"];
      bool listed = false;
      for (size_t i = 0; leader.IsString() && i < urls.size(); ++i) {
        listed = listed || urls[i] == leader.GetString();
        if (urls[i] == leader.GetString() && i != *at) {
          *at = i;
          followed = true;
        }
      }
      if (leader.IsString() && !listed) {  // (a coordinator it did not know of: as the clients)
        urls.push_back(leader.GetString());
        *at = urls.size() - 1;
        followed = true;
      }
    }
    if (!followed) {
      *at = (*at + 1) % urls.size();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return {};
}

// One worker of `run` until the run is finished.
// `gate`: while it holds, the worker waits (at most 30 s) before each request once the run's
// workers have had `gate_after` completions counted (a test's way to keep work for later).
inline void work(std::vector<std::string> urls, const std::string& run, int w, RunLog& log,
                 const std::atomic<bool>* gate = nullptr, int gate_after = 0) {
  size_t at = 0;
  const std::string base = "/v1/runs/" + run;
  Reply reg = post(urls, &at, base + "/workers", R"({"name": "w)" + std::to_string(w) + "\"}", log);
  if (reg.status != 200) {
    log.failed = true;
    return;
  }
  const auto id_at = reg.body.find("\"worker\":") + 9;
  const std::string me =
      R"({"worker": )" + reg.body.substr(id_at, reg.body.find_first_of(",}", id_at) - id_at);
  uint64_t request = static_cast<uint64_t>(w) * 1'000'000;
  std::string body = me + R"(, "wait_ms": 2000, "request": )" + std::to_string(++request) + "}";
  std::string target = base + "/acquire";
  std::optional<RunLog::Job> held;
  for (int step = 0; step < 2000; ++step) {
    for (int i = 0; gate && *gate && log.completions >= gate_after && i < 600; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    Reply r = post(urls, &at, target, body, log);
    if (r.status != 200) {
      log.failed = true;
      ADD_FAILURE() << target << " " << body << " -> " << r.status << " " << r.body;
      return;
    }
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    if (held && d.HasMember("counted") && d["counted"].GetBool()) {
      std::lock_guard lock(log.mu);
      log.accepted[*held] += 1;
      log.completions += 1;
    }
    const rapidjson::Value& next = d.HasMember("next") ? d["next"] : d;
    const std::string status = next["status"].GetString();
    if (status == "finished") return;
    if (status == "job") {
      const auto& job = next["job"];
      held = RunLog::Job{job["set"].GetString(), job["epoch"].GetInt64(), job["index"].GetInt64()};
      target = base + "/complete";
      body = me + R"(, "lease": )" + std::to_string(job["lease"].GetUint64()) +
             R"(, "loss": 0.5, "samples": 1, "next": true, "wait_ms": 2000, "request": )" +
             std::to_string(++request) + "}";
    } else {
      held.reset();
      target = base + "/acquire";
      body = me + R"(, "wait_ms": 2000, "request": )" + std::to_string(++request) + "}";
    }
  }
}

// Worker threads, joined when it goes out of scope (also when a failed ASSERT returns early: a
// joinable thread destroyed would end the process without stopping its servers); `gate` is
// opened first.
struct WorkerThreads {
  std::vector<std::thread> threads;
  std::atomic<bool>* gate = nullptr;
  void join() {
    if (gate) *gate = false;
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
  }
  ~WorkerThreads() { join(); }
};

// GET /v1/coordinator's per-run view: run -> {role, leader, term}.
inline std::map<std::string, std::tuple<std::string, std::string, int64_t>> runs_of(
    const std::string& url) {
  std::map<std::string, std::tuple<std::string, std::string, int64_t>> out;
  const Reply r = http(url, "GET", "/v1/coordinator");
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("runs")) return out;
  for (const auto& run : d["runs"].GetArray()) {
    out[run["run"].GetString()] = {run["role"].GetString(),
                                   run["leader"].IsString() ? run["leader"].GetString() : "",
                                   run["term"].GetInt64()};
  }
  return out;
}

}  // namespace traincoord::testing
