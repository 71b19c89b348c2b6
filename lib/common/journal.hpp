// Our log lines in journald (log.cpp). Under systemd, when stderr is the journal stream systemd
// gave the process ($JOURNAL_STREAM names it), lines go to journald natively instead of as text:
// PRIORITY from the level, DDP_SUBSYSTEM (the logger), and the job fields below.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp::log {

// The journal fields of one of our lines (pure). Lines about a job begin "job <id>" and go on
// " round <n>" and ": rank <r> ..." where they concern one: DDP_JOB_ID, DDP_ROUND, DDP_RANK
// (`journalctl DDP_JOB_ID=<id>` lists a job's lines).
std::vector<std::pair<std::string, std::string>> journal_fields(std::string_view message);

// Whether stderr is the journal stream $JOURNAL_STREAM ("<device>:<inode>") names (pure).
bool is_journal_stream(const char* journal_stream, unsigned long long dev, unsigned long long ino);

}  // namespace ddp::log
