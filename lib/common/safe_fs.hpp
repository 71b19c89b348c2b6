// Files in folders that someone else can write: a root agent's per-user log folders, where a
// job's own processes may put a symbolic link, a FIFO or a hard link wherever a file of ours
// is expected.
//
// Policy: a path is trusted only up to a folder we opened ourselves (Dir::open: the admin's
// log_dir, or a folder a non-root launcher owns). Below it every step goes through a directory
// fd, one name at a time, and never follows a symbolic link (O_NOFOLLOW, mkdirat, renameat,
// unlinkat); ownership and modes are set through the fd (fchown, fchmod), never by name; a file
// is checked with fstat after it is open and before a byte is read or written: a regular file
// (a folder for Dir), with one name, owned by whom we expect, and read only up to a bound. A
// job can still delete or rename its own files; it cannot make us touch anything else.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ddp::safefs {

// What went wrong, with the path and what to do; `error` is the errno behind it (EEXIST for a
// fresh folder that exists, ELOOP for a link, EPERM for a wrong owner or kind).
class FsError : public std::runtime_error {
 public:
  FsError(int error, const std::string& what) : std::runtime_error(what), error_(error) {}
  int error() const { return error_; }

 private:
  int error_;
};

// Who a folder or file belongs to. `uid` is also who it must already belong to when it exists.
struct Owner {
  uid_t uid = 0;
  gid_t gid = 0;
};

// An owned file descriptor (closed on destruction).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// An open folder: its fd, and its path for messages only (never used to reach it again).
class Dir {
 public:
  // A trusted folder: the path is followed as the system resolves it. Throws FsError.
  static Dir open(const std::string& path);
  // The folder `rel` below `base` (names separated by '/', no "..", no "."), each step without
  // following a link; each folder must belong to `expect_uid` (when given). Throws FsError.
  static Dir open_beneath(const Dir& base, std::string_view rel, std::optional<uid_t> expect_uid = std::nullopt);

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  std::string path_of(std::string_view name) const;

 private:
  Dir(Fd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  Fd fd_;
  std::string path_;
};

// One name: not empty, no '/', not "." or "..". Throws FsError (EINVAL) otherwise.
void check_name(std::string_view name);

// Makes folder `name` in `parent` (mode `mode`, given to `owner` when set, else ours) and
// opens it. An existing one is refused with EEXIST when `fresh`; otherwise it is used if it is
// a folder (not a link) that already belongs to the owner's uid (ours without an owner).
Dir make_dir(const Dir& parent, const std::string& name, mode_t mode, const std::optional<Owner>& owner, bool fresh);

// Opens `name` in `dir` to append, creating it (0600) if it is not there. Refused (FsError): a
// link, anything but a regular file, a file with more than one name, a file that belongs to
// another uid than the owner's (ours without an owner). It is then given to `owner`, mode 0600.
Fd open_append(const Dir& dir, const std::string& name, const std::optional<Owner>& owner);

// Creates `name` in `dir` new (O_EXCL, never through a link), 0600, given to `owner`.
Fd create_new(const Dir& dir, const std::string& name, const std::optional<Owner>& owner);

// Renames `from` to `to` within `dir` (replacing `to`, as rename(2); links are moved, not followed).
void rename_in(const Dir& dir, const std::string& from, const std::string& to);

// Writes `text` as `name` in `dir`: made new under a temporary name (O_EXCL, never through a
// link), 0600, given to `owner`, then renamed over `name` (a link or FIFO there is replaced,
// never followed or written through). Throws FsError; leaves no temporary file behind.
void replace_file(const Dir& dir, const std::string& name, std::string_view text, const std::optional<Owner>& owner);

// Removes `name` from `dir` if it is there (a link is removed, not its target); never throws.
void remove_in(const Dir& dir, const std::string& name) noexcept;

// A file read from a folder someone else can write.
struct ReadResult {
  enum class Kind { ok, missing, refused, too_big } kind = Kind::missing;
  std::string text;    // ok: the content
  std::string reason;  // refused: why (a link, not a regular file, owner), for the report
  std::uint64_t size = 0;
};
// Reads `name` in `dir` if it is a regular file with one name that belongs to `owner_uid`, of at
// most `max_bytes`. Never follows a link, never blocks on a FIFO, never throws.
ReadResult read_owned(const Dir& dir, const std::string& name, uid_t owner_uid, std::size_t max_bytes) noexcept;

// A file named by a path in a folder someone else may write (`ddpctl logs` run by root over a
// job's log folder), opened to read: its folder is opened without following a link there
// (O_DIRECTORY|O_NOFOLLOW; the path above it is followed), then the file below that fd without
// following a link or blocking on a FIFO (O_NOFOLLOW|O_NONBLOCK). Refused: anything but a
// regular file with one name that belongs to its folder's owner. Never throws.
struct OpenResult {
  Fd fd;                 // open: read it (a regular file: O_NONBLOCK changes nothing)
  bool missing = false;  // no such file (or folder)
  std::string reason;    // not open and not missing: why, for the user
};
OpenResult open_in_folder_to_read(const std::string& path) noexcept;

// Writes all of `data` to `fd` (retrying short writes and EINTR); false on an error.
bool write_all(int fd, std::string_view data) noexcept;

// A folder the environment names (XDG_RUNTIME_DIR, XDG_STATE_HOME, XDG_CACHE_HOME, HOME), as
// this process may use it: a user's, as it is; root's, only where no other user can swap one of
// the folders on its way, and then with every link resolved (the path to use instead of the
// one given, which a user's link may be part of): every folder from / belongs to root and is
// writable by nobody else (group or others) unless sticky like /tmp, and a part still to be
// made is not in a folder others can write. nullopt: not to be used. `su` keeps the user's
// XDG_RUNTIME_DIR and `sudo -E` all of them: root must not put its sockets, records or caches
// where a user can swap a folder for a link. `euid`: for tests.
std::optional<std::string> usable_env_dir(const std::string& path, uid_t euid = ::geteuid());

}  // namespace ddp::safefs
