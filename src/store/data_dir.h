// A directory whose files traincoord writes (the data dir, the token dir), opened once and then
// used only through its descriptor: every file in it is opened with openat(O_NOFOLLOW), and
// must be a regular file of the user's with a single link. A link planted in the dir (to a
// system file, to another user's file) is refused by name, never written through.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "core/error.h"

namespace traincoord {

// "0777", "1777": a mode as chmod takes it.
inline std::string mode_text(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

class DataDir {
 public:
  DataDir() = default;
  DataDir(DataDir&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)),
        path_(std::move(o.path_)),
        resolved_(std::move(o.resolved_)),
        what_(std::move(o.what_)) {}
  DataDir& operator=(DataDir&& o) noexcept {
    std::swap(fd_, o.fd_);
    path_ = std::move(o.path_);
    resolved_ = std::move(o.resolved_);
    what_ = std::move(o.what_);
    return *this;
  }
  ~DataDir() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Opens the directory `path` (the links on the way to it are followed: the operator chose
  // them). `what` names it in messages ("data dir", "token dir"). Unless `read_only`, refuses
  // a dir that is not the user's (or root's), or that other users may write to (group or
  // other write bit, sticky or not): they could plant a link or a file of their own in it.
  static Result<DataDir> open(const std::string& path, bool read_only,
                              std::string what = "data dir") {
    DataDir d;
    d.path_ = path;
    d.what_ = std::move(what);
    d.fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d.fd_ < 0) {
      const int err = errno;
      if (err == ENOENT) return not_found(d.what_ + " " + path + " does not exist");
      return failed_precondition("cannot open " + d.what_ + " " + path + ": " + std::strerror(err));
    }
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr) {
      return failed_precondition("cannot resolve " + d.what_ + " " + path + ": " +
                                 std::strerror(errno));
    }
    d.resolved_ = resolved;
    struct stat st {};
    if (::fstat(d.fd_, &st) != 0) {
      return failed_precondition("cannot stat " + d.what_ + " " + path + ": " +
                                 std::strerror(errno));
    }
    if (!read_only) {
      if (st.st_uid != ::geteuid() && st.st_uid != 0) {
        return failed_precondition(d.what_ + " " + path +
                                   " belongs to another user, who could put files of their own "
                                   "there; use a directory of your own");
      }
      if ((st.st_mode & 022) != 0) {
        return failed_precondition(
            d.what_ + " " + path + " (mode " + mode_text(st.st_mode) +
            ") may be written by other users, who could plant links or files there that "
            "traincoord would write through or trust: chmod 700 " +
            path + " (or use a directory of your own)");
      }
    }
    return d;
  }

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // The dir's path without links (realpath), for what must open it by name (SQLite).
  const std::string& resolved() const { return resolved_; }
  std::string path_of(const std::string& name) const { return path_ + "/" + name; }

  // Takes an exclusive lock on the dir itself (flock on its descriptor), held while this
  // object lives. Refused, naming the holder's pid as the file `pid_file` in the dir says it,
  // when another process holds it. Then checks that the path still names the dir locked (a dir
  // swapped in the meantime is refused).
  Result<void> lock(const std::string& pid_file) const {
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) {  // (not held by another: a file system without flock, ...)
        return failed_precondition("cannot lock " + what_ + " " + path_ + ": " +
                                   std::strerror(errno) +
                                   " (the data dir must be on a local file system)");
      }
      std::string holder = holder_of_lock();
      const int pf =
          holder.empty() ? ::openat(fd_, pid_file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
      if (pf >= 0) {
        char pid[32] = {};
        const ssize_t n = ::pread(pf, pid, sizeof pid - 1, 0);
        ::close(pf);
        if (n > 0) holder.assign(pid, static_cast<size_t>(n));
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) {
          holder.pop_back();
        }
      }
      return failed_precondition(
          what_ + " " + path_ + " is in use by another traincoord process" +
          (holder.empty() ? std::string() : " (pid " + holder + ")") +
          ": stop it first, or give this one another --data-dir (`traincoord inspect` reads a "
          "data dir in use)");
    }
    struct stat held {
    }, now{};
    if (::fstat(fd_, &held) != 0 || ::stat(resolved_.c_str(), &now) != 0 ||
        held.st_dev != now.st_dev || held.st_ino != now.st_ino) {
      return failed_precondition(what_ + " " + path_ +
                                 " was replaced while traincoord opened it; start it again");
    }
    return {};
  }

  // Whether `name` exists in the dir (a link counts: it is not followed).
  bool exists(const std::string& name) const {
    struct stat st {};
    return ::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  }

  // Fails when `name` exists and is not a file traincoord may open (check_file); passes when
  // it is missing.
  Result<void> check_existing(const std::string& name, bool own = true) const {
    struct stat st {};
    if (::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return {};
    return check_file(name, st, own);
  }

  // Opens `name` in the dir with `flags` (O_NOFOLLOW and O_CLOEXEC added; O_CREAT makes it
  // with `mode`), and checks what it opened (check_file). The descriptor is the caller's.
  // *err (if given) gets errno when open(2) fails (EROFS, EACCES: a dir it may not write).
  Result<int> open_file(const std::string& name, int flags, mode_t mode = 0600, bool own = true,
                        int* err = nullptr) const {
    const int fd = ::openat(fd_, name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
      const int e = errno;
      if (err) *err = e;
      if (e == ELOOP) {
        return failed_precondition(path_of(name) +
                                   " is a symbolic link: traincoord opens no link in its " + what_ +
                                   " (it could point anywhere). Remove it (rm " + path_of(name) +
                                   "); if it was not yours, someone else could write in " + path_);
      }
      return failed_precondition("cannot open " + path_of(name) + ": " + std::strerror(e));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      return failed_precondition("cannot stat " + path_of(name) + ": " + std::strerror(errno));
    }
    if (auto r = check_file(name, st, own); !r) {
      ::close(fd);
      return tl::unexpected(r.error());
    }
    return fd;
  }

  // A file traincoord may open in the dir: a regular file (not a link, a device, a fifo), with
  // a single link (a hard link could be another name of a file elsewhere), and, when `own`,
  // the user's and not writable by others.
  Result<void> check_file(const std::string& name, const struct stat& st, bool own = true) const {
    const std::string p = path_of(name);
    if (S_ISLNK(st.st_mode)) {
      return failed_precondition(p + " is a symbolic link: traincoord opens no link in its " +
                                 what_ + " (it could point anywhere). Remove it (rm " + p +
                                 "); if it was not yours, someone else could write in " + path_);
    }
    if (!S_ISREG(st.st_mode)) {
      return failed_precondition(p + " is not a regular file: move it out of the " + what_);
    }
    if (st.st_nlink != 1) {
      return failed_precondition(p + " has " + std::to_string(st.st_nlink) +
                                 " hard links: it could be another name of a file elsewhere, "
                                 "which traincoord would write. Remove the other names, or "
                                 "copy it (cp " +
                                 p + " " + p + ".copy && mv " + p + ".copy " + p + ")");
    }
    if (own && st.st_uid != ::geteuid()) {
      return failed_precondition(p + " belongs to another user (uid " + std::to_string(st.st_uid) +
                                 "): traincoord writes only files of its own user there; "
                                 "chown it, or remove it");
    }
    if (own && (st.st_mode & 022) != 0) {
      return failed_precondition(p + " (mode " + mode_text(st.st_mode) +
                                 ") may be written by other users: chmod 600 " + p);
    }
    return {};
  }

 private:
  // The pid of the process holding a flock on this dir, as /proc/locks says (Linux; empty when
  // unknown): it stays known when the pid file was removed.
  std::string holder_of_lock() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) return {};
    FILE* locks = std::fopen("/proc/locks", "re");
    if (locks == nullptr) return {};
    char line[256];
    std::string found;
    const std::string inode = ":" + std::to_string(st.st_ino) + " ";
    while (found.empty() && std::fgets(line, sizeof line, locks) != nullptr) {
      // "1: FLOCK  ADVISORY  WRITE 4242 08:02:1234567 0 EOF"
      const std::string l(line);
      if (l.find(" FLOCK ") == std::string::npos || l.find(inode) == std::string::npos) continue;
      const auto write = l.find("WRITE ");
      if (write == std::string::npos) continue;
      found = l.substr(write + 6, l.find(' ', write + 6) - (write + 6));
    }
    std::fclose(locks);
    return found;
  }

  int fd_ = -1;
  std::string path_, resolved_, what_ = "data dir";
};

}  // namespace traincoord
