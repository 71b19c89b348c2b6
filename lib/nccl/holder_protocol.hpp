// The NCCL id holder, `ddp-ncclid`: what the launcher can count on. The binary lives in
// apps/ddp-ncclid; this header is the contract, plus a pure parser of its one output line.
//
// Why a process: NCCL's bootstrap root listens inside the process that calls ncclGetUniqueId
// and must live until every rank of the attempt has joined. It must load the same libnccl.so.2
// as the workers and bind the workers' NCCL interface, so it runs with the workers' environment.
//
// The protocol, exactly:
//
//   argv:   ddp-ncclid [--nccl-lib PATH] [--expect-parent PID]
//           (--nccl-lib: dlopen this file instead of "libnccl.so.2" through the loader's search;
//            --expect-parent: the launcher's pid; the holder exits 3 at once if its parent is
//            already someone else, which closes the race with PR_SET_PDEATHSIG)
//   env:    the workers' environment (LD_LIBRARY_PATH, NCCL_SOCKET_IFNAME, NCCL_* ...).
//   stdin:  a pipe the launcher keeps open for the whole attempt. Bytes written to it are
//           ignored; EOF (the launcher closed its end, or died) means "stop". Never /dev/null:
//           that is an immediate EOF.
//   stdout: exactly one line, then nothing:
//             success: 256 lowercase hex characters (the 128-byte ncclUniqueId) and "\n";
//             failure: "error: <message>\n", then exit status 3 at once.
//   stderr: human diagnostics (log lines: NCCL version and file, the root's address). Not parsed.
//   after the id line it stays alive, serving NCCL's bootstrap root, until the first of:
//           EOF on stdin, SIGTERM, SIGINT, SIGHUP, SIGQUIT, or the death of its parent (PR_SET_PDEATHSIG SIGTERM);
//           then it exits 0 without tearing down NCCL (the root thread ends with the process).
//   exit:   0  stopped as asked after serving an id;
//           3  failure, after the "error: " line (bad flags included) when stdout still works;
//           anything else (a signal, an exit before any line): a crash; report it as such.
//
// PR_SET_PDEATHSIG fires when the *thread* that forked the holder exits, not only the process:
// spawn it from a thread that lives as long as the launcher (its main or event-loop thread).
//
// The launcher: spawn it per attempt, read one line with a deadline (normally well under a
// second; NCCL scans interfaces first), set DDP_NCCL_UNIQUE_ID=<hex> in every worker's env,
// and close the holder's stdin (or SIGTERM it) when the attempt ends, then reap it. The next
// attempt gets a new holder and a new id.
#pragma once

#include "nccl/unique_id.hpp"

#include <string_view>

namespace ddp::nccl::holder {

inline constexpr std::string_view kBinaryName = "ddp-ncclid";
inline constexpr std::string_view kErrorPrefix = "error: ";
inline constexpr int kExitStopped = 0;
inline constexpr int kExitFailed = 3;
// The variable every worker gets the id in.
inline constexpr std::string_view kEnvVar = "DDP_NCCL_UNIQUE_ID";

// Parses the holder's one stdout line (a trailing "\n" or "\r\n" is allowed). On an "error: "
// line the result's error is the holder's message; on anything else, what was wrong with it.
Parsed<UniqueId> parse_line(std::string_view line);

}  // namespace ddp::nccl::holder
