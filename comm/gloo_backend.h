// comm/gloo_backend.h: GlooProcessGroup, the ProcessGroup over Gloo's TCP transport. Ranks meet through
// a Store (each publishes its listening addresses, then connects a full mesh); collectives run on host memory
// and complete before they return.
//
// After a collective fails (a peer died, a timeout) Gloo's transport is in an unknown state: the group then
// refuses further collectives with CommError, and the caller should tear down (and the launcher restart).
// A collective's label (opts.what; TracedGroup passes "allreduce #12 (bucket 0, step 3)") names it in errors.
// Gloo's TimeoutError comes at the same time as TracedGroup's watchdog fires (both use dist.timeout_s), and
// TracedGroup turns it into the same hang report, which names the rank that is missing.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/store.h"

namespace gloo {
class Algorithm;
class Context;
}

namespace dpt::comm {

struct GlooOptions {
  // Rendezvous and every collective; negative: no timeout.
  std::chrono::milliseconds timeout = kDefaultTimeout;
  // Picks the local address Gloo listens on: see gloo_bind_host().
  std::string master_addr = "127.0.0.1";
  std::string iface;  // GLOO_SOCKET_IFNAME: listen on this interface's address instead
};

// The local address Gloo should listen on: 127.0.0.1 when master_addr is a loopback address, else the
// address of `iface` when given, else the local address the kernel routes master_addr's traffic from.
// Returns either {hostname, ""} or {"", iface}. Throws CommError naming MASTER_ADDR when no route exists.
struct GlooBind {
  std::string hostname;
  std::string iface;
};
GlooBind gloo_bind(const std::string& master_addr, const std::string& iface);

class GlooProcessGroup : public ProcessGroup {
 public:
  // Rendezvous through `store` (keys are written under it as they are: give each group its own prefix),
  // then a barrier, so that when the constructor returns every rank has connected and the store's server
  // may go away. Throws TimeoutError/CommError naming the rank when peers do not show up.
  GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size, const GlooOptions& opts = {});
  ~GlooProcessGroup() override;

  std::string backend() const override { return "gloo"; }
  std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts = {}) override;
  std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts = {}) override;
  std::shared_ptr<Work> allgather(const Tensor& input, Tensor& output, const AllgatherOptions& opts = {}) override;
  // Two ranks (sum or avg; the output this rank's chunk of `input` or apart from it): each sends the other its chunk
  // of `input` and adds what it receives, the same bits as the allreduce's chunk, half its traffic. Otherwise an
  // allreduce of a copy of `input` (Gloo's own reduce-scatter is unsound here: see gloo_backend.cpp), this rank's
  // chunk copied out: twice the traffic of a true reduce-scatter, and a temporary the size of `input`.
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, Tensor& output, const AllreduceOptions& opts = {}) override;
  std::shared_ptr<Work> barrier() override;

  // The timeout of later collectives (the rendezvous used the one given to the constructor; so do the two-rank
  // persistent rings, whose synchronous connection takes its timeout when it connects).
  std::chrono::milliseconds timeout() const;
  void set_timeout(std::chrono::milliseconds timeout);
  // Where Gloo listens on this rank ("127.0.0.1", "eth0"...): for logs.
  const std::string& bind_description() const { return bind_description_; }

 private:
  // Runs one Gloo call under the group's lock, turning Gloo's exceptions into CommError/TimeoutError.
  template <class F>
  void run(const std::string& op, F&& f);
  uint32_t next_tag() { return tag_++; }

  std::shared_ptr<Store> store_;  // kept: rank 0's holds the TcpStore server the others connected to
  std::chrono::milliseconds timeout_;  // guarded by mu_
  std::string bind_description_;
  std::shared_ptr<gloo::Context> context_;
  std::shared_ptr<gloo::Context> ring_context_;  // two ranks: the persistent rings' synchronous-mode connection
  mutable std::mutex mu_;  // one collective at a time: Gloo ops on a context must not interleave
  uint32_t tag_ = 0;
  std::string broken_;  // why the group is unusable, after a failed collective
  // Persistent float sum rings (two ranks) per (buffer, count), one per chunk of the buffer, run in turn: created on
  // first use, in the same order on every rank (the contract of AllreduceOptions::persistent).
  std::map<std::pair<void*, size_t>, std::vector<std::unique_ptr<gloo::Algorithm>>> rings_;
  Tensor received_;  // the two-rank reduce-scatter's receive buffer, grown as needed (guarded by mu_)
};

}  // namespace dpt::comm
