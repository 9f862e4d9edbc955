// trainer/dir_lock.h: one run at a time in a checkpoint directory. Two jobs given one checkpoint.dir overwrite and
// resume each other's checkpoints (a second job started 1.5 s after the first went on from the first's step 15 and
// set its newer checkpoint aside); rank 0 of a training run holds CHECKPOINT_DIR/.lock (flock) for the whole run.
#pragma once

#include <string>

namespace dpt::trainer {

// Who a lock file names: its first line "pid host job", then a note (MetricsLog: the writer's checkpoint.dir).
struct LockHolder {
  std::string pid, host, job, note;
};

// One try at PATH (created when missing) with flock(LOCK_EX | LOCK_NB); when taken, this process is written in it
// ("pid host job", then `note`). `before` is whom the file named before the try: the holder when another process
// holds it, else the last one that did (empty fields for a new file). A file system without flock, or a PATH that
// cannot be opened, gives neither held nor taken (a debug line).
struct LockTry {
  int fd = -1;          // >= 0: held until closed
  bool taken = false;   // another process holds it
  LockHolder before;
};
LockTry try_lock_file(const std::string& path, const std::string& job, const std::string& note = "");

class DirLock {
 public:
  // Takes DIR/.lock (DIR created when missing), writing who holds it: "pid host job". ConfigError when another run
  // holds it, naming that run, unless the holder is an earlier attempt of the same job (`job`: TrainState::job, not
  // empty; a restarted or re-formed job whose old rank 0 is still exiting or frozen): then a warning, and this run
  // goes on without the lock. A file system without flock (some network ones), or a DIR that cannot be created here
  // (the checkpoint writer reports that), holds nothing, with a debug line.
  DirLock(const std::string& dir, const std::string& job);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace dpt::trainer
