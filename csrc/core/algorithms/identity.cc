#include "core/algorithms/identity.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "core/algorithms/registry.h"
#include "core/common/error.h"
#include "core/transport/shm/shm_area.h"

namespace ringx {

void addIdentityChecks(Schedule& s, const CollArgs& a, const CollIdentity& mine) {
  std::set<int> peers;
  std::vector<std::pair<StepId, int>> recvs;
  for (StepId i = 0; i < s.steps().size(); ++i) {
    const Step& st = s.steps()[i];
    if (st.kind == StepKind::Send) peers.insert(st.peer);
    if (st.kind == StepKind::Recv && st.peer >= 0) {
      peers.insert(st.peer);
      recvs.emplace_back(i, st.peer);
    }
  }
  if (peers.empty()) return;
  const uint64_t tag = collTag(a.seq, kIdentityTagIndex);
  auto* out = s.scratch(sizeof(CollIdentity));
  std::memcpy(out, &mine, sizeof(mine));
  for (int q : peers) s.send(q, tag, out, sizeof(mine));
  std::map<int, StepId> checked;
  for (int p : peers) {
    auto* in = s.scratch(sizeof(CollIdentity));
    const StepId got = s.recv(p, tag, in, sizeof(CollIdentity));
    checked[p] = s.poll(
        [=] {
          CollIdentity theirs;
          std::memcpy(&theirs, in, sizeof(theirs));
          if (theirs != mine) throw Error(ErrorKind::InvalidArgument, mismatch(mine, theirs, p));
          return true;
        },
        nullptr, {got});
  }
  for (auto [step, peer] : recvs) s.addDependency(checked[peer], step);
}

Schedule buildRejection(const CollArgs& a, const std::string& why) {
  Schedule s(a.dtype, a.op);
  s.setAlgorithm("rejected");
  CollIdentity id;
  id.seq = a.seq;
  id.kind = uint8_t(a.coll);
  id.root = a.root;
  id.flags = kRejected;
  auto* out = s.scratch(sizeof(id));
  std::memcpy(out, &id, sizeof(id));
  std::vector<StepId> sent;
  for (int q = 0; q < a.size; ++q) {
    if (q != a.rank) sent.push_back(s.send(q, collTag(a.seq, kIdentityTagIndex), out, sizeof(id)));
  }
  // Peers in a shared-memory algorithm read headers, not messages: the
  // rejection goes into the slot of the first chunk theirs would use, in
  // both rings (a small broadcast or scatter reads the eager one).
  if (ShmArea* shm = a.shm) {
    const uint64_t chunk = shm->reserveChunks(1);
    sent.push_back(s.poll(
        [shm, chunk, id] {
          if (shm->chunksDone().load(std::memory_order_acquire) + 1 < chunk || !shm->slotFree(chunk)) return false;
          shm->header(shm->rank(), int(chunk % 2)) = id;
          shm->eagerHeader(shm->rank(), chunk) = id;
          shm->counter(shm->rank()).store(2 * chunk - 1, std::memory_order_release);
          shm->ring();
          return true;
        },
        [shm, chunk] { return shm->holdingSlot(chunk); }));
  }
  const StepId fail = s.poll([why]() -> bool { throw Error(ErrorKind::InvalidArgument, why); }, nullptr);
  for (StepId st : sent) s.addDependency(st, fail);
  return s;
}

Schedule buildChecked(const Algorithm& alg, const CollArgs& a) {
  Schedule s = alg.build(a);
  CollIdentity id = identityOf(a);
  id.algorithm = uint8_t(1 + (&alg - algorithms().data()));
  id.segmentBytes = uint32_t(std::min<size_t>(a.segmentBytes, UINT32_MAX));
  addIdentityChecks(s, a, id);
  return s;
}

}  // namespace ringx
