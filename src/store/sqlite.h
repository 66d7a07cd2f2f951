// A thin RAII layer over SQLite's C API: a database, and prepared statements that reset
// themselves. Errors come back as values carrying SQLite's message.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace traincoord::sqlite {

class Statement {
 public:
  Statement() = default;
  Statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt, &sqlite3_finalize) {}

  Statement& bind(int index, int64_t v) {
    sqlite3_bind_int64(stmt_.get(), index, v);
    return *this;
  }
  Statement& bind(int index, uint64_t v) { return bind(index, static_cast<int64_t>(v)); }
  Statement& bind(int index, int v) { return bind(index, static_cast<int64_t>(v)); }
  Statement& bind(int index, double v) {
    sqlite3_bind_double(stmt_.get(), index, v);
    return *this;
  }
  Statement& bind(int index, std::string_view v) {
    sqlite3_bind_text(stmt_.get(), index, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind(int index, const char* v) { return bind(index, std::string_view(v)); }
  Statement& bind_blob(int index, std::string_view v) {
    sqlite3_bind_blob(stmt_.get(), index, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // As bind() and bind_blob(), without SQLite's copy of the bytes: REQUIRES that `v` stays
  // alive and unchanged until run() (or step() to the end). For the store's hot loop, where
  // the batch outlives its statements.
  Statement& bind_ref(int index, std::string_view v) {
    sqlite3_bind_text(stmt_.get(), index, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
    return *this;
  }
  Statement& bind_blob_ref(int index, std::string_view v) {
    sqlite3_bind_blob(stmt_.get(), index, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
    return *this;
  }
  Statement& bind_null(int index) {
    sqlite3_bind_null(stmt_.get(), index);
    return *this;
  }

  // Steps once: true with a row to read, false when done. Resets and clears bindings when
  // done or on error, so the statement is ready for its next use.
  Result<bool> step() {
    const int rc = sqlite3_step(stmt_.get());
    if (rc == SQLITE_ROW) return true;
    sqlite3_reset(stmt_.get());
    sqlite3_clear_bindings(stmt_.get());
    if (rc == SQLITE_DONE) return false;
    return failed_precondition(std::string("SQLite: ") + sqlite3_errmsg(db_));
  }
  // Runs a statement that returns no rows.
  Result<void> run() {
    auto r = step();
    if (!r) return tl::unexpected(r.error());
    if (*r) {
      sqlite3_reset(stmt_.get());
      sqlite3_clear_bindings(stmt_.get());
    }
    return {};
  }
  void reset() {
    sqlite3_reset(stmt_.get());
    sqlite3_clear_bindings(stmt_.get());
  }

  int64_t int64(int col) const { return sqlite3_column_int64(stmt_.get(), col); }
  double real(int col) const { return sqlite3_column_double(stmt_.get(), col); }
  bool is_null(int col) const { return sqlite3_column_type(stmt_.get(), col) == SQLITE_NULL; }
  std::string text(int col) const {
    const auto* p = sqlite3_column_text(stmt_.get(), col);
    return p ? std::string(reinterpret_cast<const char*>(p),
                           static_cast<size_t>(sqlite3_column_bytes(stmt_.get(), col)))
             : std::string();
  }
  std::string blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_.get(), col);
    return p ? std::string(static_cast<const char*>(p),
                           static_cast<size_t>(sqlite3_column_bytes(stmt_.get(), col)))
             : std::string();
  }

 private:
  sqlite3* db_ = nullptr;
  std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> stmt_{nullptr, &sqlite3_finalize};
};

class Db {
 public:
  // Opens (read-only, or read-write creating the file) the database at `path`. `extra_flags`:
  // more SQLITE_OPEN_* flags (SQLITE_OPEN_NOFOLLOW, SQLITE_OPEN_URI). On failure the error's
  // message names the path and SQLite's reason; *rc_out (if given) gets SQLite's result code.
  static Result<Db> open(const std::string& path, bool read_only, int extra_flags = 0,
                         int* rc_out = nullptr) {
    // No memory statistics: with them, every allocation of SQLite's takes a global mutex
    // (~2% of the store thread under bench/loadgen). Only possible before SQLite initialises;
    // refused (and harmless) after.
    [[maybe_unused]] static const int no_memstatus = sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    sqlite3* raw = nullptr;
    const int flags = read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    const int rc =
        sqlite3_open_v2(path.c_str(), &raw, flags | extra_flags | SQLITE_OPEN_NOMUTEX, nullptr);
    Db db(raw);
    if (rc_out) *rc_out = raw ? sqlite3_extended_errcode(raw) : rc;
    if (rc != SQLITE_OK) {
      return failed_precondition("cannot open " + path + ": " +
                                 (raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
    }
    sqlite3_busy_timeout(raw, 5000);
    return db;
  }

  Result<void> exec(const std::string& sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_.get(), sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      std::string message = error ? error : sqlite3_errmsg(db_.get());
      sqlite3_free(error);
      return failed_precondition("SQLite: " + message);
    }
    return {};
  }

  Result<Statement> prepare(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v3(db_.get(), sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr) !=
        SQLITE_OK) {
      return failed_precondition(std::string("SQLite: ") + sqlite3_errmsg(db_.get()) + " in " +
                                 sql);
    }
    return Statement(db_.get(), stmt);
  }

  // The single value of a query such as "PRAGMA user_version".
  Result<std::string> scalar(const std::string& sql) {
    auto stmt = prepare(sql);
    if (!stmt) return tl::unexpected(stmt.error());
    auto row = stmt->step();
    if (!row) return tl::unexpected(row.error());
    std::string value = *row ? stmt->text(0) : std::string();
    stmt->reset();
    return value;
  }

  int64_t last_insert_rowid() const { return sqlite3_last_insert_rowid(db_.get()); }
  sqlite3* raw() const { return db_.get(); }

 private:
  explicit Db(sqlite3* db) : db_(db, &sqlite3_close) {}
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> db_;
};

}  // namespace traincoord::sqlite
