// How the journal in etcd (etcd_run_journal.h, leadership per run) writes what it keeps: run
// names in keys, record numbers in keys, the records of a log key and its value (deflated), and
// reading a whole prefix.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "journal/etcd_client.h"
#include "journal/journal.h"

namespace traincoord::etcd_records {

// A run's name as one key segment: '%' and '/' as %25 and %2F; unescape() undoes it.
std::string escape(std::string_view run);
std::string unescape(std::string_view s);
// `n` in 20 digits, so that keys sort as the numbers do.
std::string pad20(int64_t n);

// Appends `r` as "SEQ TIME KIND OUTCOME HAS_REPLY TARGET_LEN BODY_LEN REPLY_LEN\n" and then its
// target, body and reply bytes.
void encode_record(const Record& r, std::string* out);
// The records of `in` (of run `run`), appended to `out`; false when `in` is damaged.
bool decode_records(std::string_view run, std::string_view in, std::vector<Record>* out);
// A log key's value: the encoded records `raw`, deflated ("Z" RAW_BYTES "\n" ZLIB_BYTES).
std::string pack_records(const std::string& raw);
// The encoded records of a log key's value (deflated or plain); false when it is damaged.
bool unpack_records(const std::string& value, std::string* raw);

// Every key under `prefix`, a page at a time.
Result<std::vector<etcd::KeyValue>> range_all(etcd::Client& client, const std::string& prefix);

}  // namespace traincoord::etcd_records
