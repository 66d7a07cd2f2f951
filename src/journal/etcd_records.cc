#include "journal/etcd_records.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include <zlib.h>

namespace traincoord::etcd_records {

std::string escape(std::string_view run) {
  std::string out;
  for (char c : run) {
    if (c == '%') {
      out += "%25";
    } else if (c == '/') {
      out += "%2F";
    } else {
      out += c;
    }
  }
  return out;
}

std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() + 0 && s.substr(i, 3) == "%25") {
      out += '%';
      i += 2;
    } else if (s[i] == '%' && s.substr(i, 3) == "%2F") {
      out += '/';
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string pad20(int64_t n) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%020" PRId64, n);
  return buf;
}

// Records, each as "SEQ TIME KIND OUTCOME HAS_REPLY TARGET_LEN BODY_LEN REPLY_LEN\n" and then
// the target, body and reply bytes.
void encode_record(const Record& r, std::string* out) {
  char head[160];
  std::snprintf(head, sizeof head, "%" PRId64 " %" PRId64 " %d %d %d %zu %zu %zu\n", r.seq,
                static_cast<int64_t>(r.time), static_cast<int>(r.kind), r.outcome, r.reply ? 1 : 0,
                r.target.size(), r.body.size(), r.reply ? r.reply->size() : 0);
  *out += head;
  *out += r.target;
  *out += r.body;
  if (r.reply) *out += *r.reply;
}

bool decode_records(std::string_view run, std::string_view in, std::vector<Record>* out) {
  while (!in.empty()) {
    const auto nl = in.find('\n');
    if (nl == std::string_view::npos) return false;
    const std::string head(in.substr(0, nl));
    in.remove_prefix(nl + 1);
    Record r;
    int64_t seq = 0, time = 0;
    int kind = 0, outcome = 0, has_reply = 0;
    size_t tl = 0, bl = 0, rl = 0;
    if (std::sscanf(head.c_str(), "%" SCNd64 " %" SCNd64 " %d %d %d %zu %zu %zu", &seq, &time,
                    &kind, &outcome, &has_reply, &tl, &bl, &rl) != 8)
      return false;
    if ((kind != 1 && kind != 2) || tl + bl + rl > in.size() || seq <= 0) return false;
    r.seq = seq;
    r.run = std::string(run);
    r.time = time;
    r.kind = static_cast<RecordKind>(kind);
    r.outcome = outcome;
    r.target = std::string(in.substr(0, tl));
    r.body = std::string(in.substr(tl, bl));
    if (has_reply) r.reply = std::string(in.substr(tl + bl, rl));
    in.remove_prefix(tl + bl + rl);
    out->push_back(std::move(r));
  }
  return true;
}

// A log key's value as stored: its records deflated ("Z" RAW_BYTES "\n" ZLIB_BYTES). A wave's
// records are much alike (the same targets, bodies and replies but for a few numbers): deflated
// at zlib's fastest level they take a fraction of the bytes, and etcd's cost per write grows
// with its bytes (a Raft round, then the WAL of each member). A value that starts with a digit
// is records as they are (as written before; still read).
std::string pack_records(const std::string& raw) {
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::string out = "Z" + std::to_string(raw.size()) + "\n";
  const size_t at = out.size();
  out.resize(at + size);
  const int r = compress2(reinterpret_cast<Bytef*>(out.data() + at), &size,
                          reinterpret_cast<const Bytef*>(raw.data()),
                          static_cast<uLong>(raw.size()), Z_BEST_SPEED);
  TC_ASSERT(r == Z_OK);
  out.resize(at + size);
  return out;
}

// The records of a log key's value (packed or not); false when it is damaged.
bool unpack_records(const std::string& value, std::string* raw) {
  if (value.empty() || value[0] != 'Z') {
    *raw = value;
    return true;
  }
  const auto nl = value.find('\n');
  if (nl == std::string::npos || nl == 1 || nl > 12) return false;
  const uint64_t bytes = std::strtoull(value.c_str() + 1, nullptr, 10);
  if (bytes > (uint64_t{1} << 31)) return false;
  raw->resize(bytes);
  uLongf size = static_cast<uLongf>(bytes);
  const int r = uncompress(reinterpret_cast<Bytef*>(raw->data()), &size,
                           reinterpret_cast<const Bytef*>(value.data() + nl + 1),
                           static_cast<uLong>(value.size() - nl - 1));
  return r == Z_OK && size == bytes;
}

// Reads every key under `prefix`, a page at a time.
Result<std::vector<etcd::KeyValue>> range_all(etcd::Client& client, const std::string& prefix) {
  std::vector<etcd::KeyValue> all;
  const std::string end = etcd::prefix_end(prefix);
  std::string from = prefix;
  while (true) {
    auto page = client.range(from, end, 500);
    if (!page) return tl::unexpected(page.error());
    for (auto& kv : page->kvs) all.push_back(std::move(kv));
    if (page->kvs.size() < 500 || static_cast<int64_t>(page->kvs.size()) >= page->count) break;
    from = all.back().key + std::string(1, '\0');
  }
  return all;
}

}  // namespace traincoord::etcd_records
