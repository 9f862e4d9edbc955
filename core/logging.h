// core/logging.h: spdlog set-up with the rank in every line.
//
// Convention (STYLE.md): rank 0 prints summaries; nothing prints per step per rank unless asked. After
// init_logging(), use spdlog::info/warn/error directly.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace dpt {

// Sets the default logger's pattern to "[time] [rank R/W] [level] message" (no rank part when world is 1,
// or when DPT_RANK_PREFIXED=1: dprun then prefixes each line itself), its level from `level` (trace, debug, info, warn, error; or DPT_LOG_LEVEL when empty), and
// records the rank for error messages.
void init_logging(int rank, int world_size, const std::string& level = "");

// Rank 0's live progress line. With a terminal on rank 0's stdout, or DPT_LIVE_LINE=1 (dprun sets it when its own
// stdout is a terminal: it relays a line ended by '\r' in place), init_logging makes progress one line redrawn
// in place instead of a line per interval: show_live_line() replaces it, and any log line written meanwhile
// first clears it (the next show_live_line() draws it again below). Off everywhere else (files, pipes, Slurm).
bool live_line_enabled();
void show_live_line(const std::string& text);

// Parses a level name; throws ConfigError listing the valid names when unknown.
spdlog::level::level_enum parse_log_level(const std::string& name);

// For main() alone (library code throws): logs `what` as an error, flushes, and ends the process with `code`
// at once, without destructors: a process group mid-collective must not be finalized politely
// (MPI_Finalize can block on peers that wait for us); the launcher or the peers' failing collectives end
// the job. Single entry: a second caller (the NCCL watchdog thread, say) waits for the first to finish.
// When DPT_REASON_FILE is set (dprun sets it), the first line of `what`, as "rank R: ...", is also written there
// unless a rank got there first: dprun prints it once as the job's reason.
[[noreturn]] void exit_with_error(int code, const std::string& what);
// The same for an end that is no failure (a stop signal before the first step): `what` logged as a warning, nothing
// written to DPT_REASON_FILE. Single entry together with exit_with_error: whichever comes first ends the process.
[[noreturn]] void exit_with_note(int code, const std::string& what);

// Writes `line` + "\n" to `path` if no one has yet: a temporary file linked into place (O_EXCL semantics: the
// first writer wins, a reader never sees half a line). Returns true if this call wrote it. Never throws; an
// empty path does nothing. (DPT_REASON_FILE: a hang report, or exit_with_error.)
bool write_reason_once(const std::string& path, const std::string& line);

}  // namespace dpt
