// Network collectives tell each peer which collective they are in before
// their data is used (see core/common/identity.h).
#pragma once

#include <string>

#include "core/algorithms/coll_args.h"
#include "core/engine/schedule.h"

namespace ringx {

// Adds to a built schedule: an exchange of identities with every peer it
// sends to or receives from (both ways, so that a rank that only sends, a
// root, learns of a mismatch too), and a check of each received one that
// every receive from that peer waits for. Ranks in different collectives
// then fail naming the peer and what differs, no byte of a mismatched peer
// lands in this rank's buffers, and the op ends only once every peer it
// talks to has joined the same collective. Costs one small message per peer
// and direction; shared-memory schedules (no transfers) are unchanged.
void addIdentityChecks(Schedule& s, const CollArgs& a, const CollIdentity& mine);

// The schedule of a call that this rank rejected for arguments only it can
// check (`why`): its identity, marked rejected, to every other rank (as a
// message, and in shared memory as the header of the chunk the call would
// have used), then a step that fails with `why`, which poisons this rank's
// communicator. The
// ranks that exchange data with this one in that call fail at once; the
// others wait on them and time out.
Schedule buildRejection(const CollArgs& a, const std::string& why);

// Selects nothing: builds `alg`'s schedule for `a` with its identity checks.
struct Algorithm;
Schedule buildChecked(const Algorithm& alg, const CollArgs& a);

}  // namespace ringx
