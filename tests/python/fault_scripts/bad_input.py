"""Runs every misuse case of cases_faults.MISUSE and records what each rank got.

    bad_input.py TIMEOUT_S            (launched by test_faults.py, one process per rank)
    bad_input.py --table [WORLD_SIZE] (launches itself and prints the markdown table of
                                       docs/failure-semantics.md)

"all" cases run on the world group (they must be rejected on every rank before
anything is sent).  Each "root" / "non-root" case runs on a fresh subgroup of every
rank with a TIMEOUT_S timeout: the ranks that see the mistake reject it, the others are
already in the collective and time out (or, if they only send, finish); the subgroup is
then aborted.  Records one "misuse" event
per case: {key, outcome: [type, mro, message] or null, seconds}.  Finally an
all_reduce on the world group must still work ("after").
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/python, for cases_faults

import faultlib as common  # noqa: E402


def body(timeout_s):
    import datetime

    import torch

    dist = common.setup(timeout_s * 4)
    import cases_faults

    r, n = dist.get_rank(), dist.get_world_size()
    for key, _what, where, fn, _types, _words in cases_faults.MISUSE:
        t0 = time.time()
        if where == "all":
            out = cases_faults.outcome(fn, None)
        else:
            g = dist.new_group(ranks=list(range(n)), timeout=datetime.timedelta(seconds=timeout_s))
            # Every rank has connected to the subgroup before any rank can abort it (a
            # rank joining a group its peer already tore down fails to connect).
            dist.barrier()
            out = cases_faults.outcome(fn, g)
            from torch.distributed import distributed_c10d as c10d

            c10d._abort_process_group(g)
        common.record("misuse", key=key, where=where, outcome=out, seconds=time.time() - t0)
    y = torch.full((5,), float(r + 1))

    def after():
        dist.all_reduce(y)
        assert torch.equal(y, torch.full((5,), float(n * (n + 1) // 2))), y

    common.attempt("after", after)
    common.finish(dist)


def table(world_size):
    sys.path.insert(0, os.path.dirname(HERE))
    import cases_faults

    launch = common.launch("bad_input.py", world_size, ["3"], timeout=300)
    by_rank = [{m["key"]: m for m in rr.records if m["event"] == "misuse"} for rr in launch]
    print("| misuse | rank(s) | exception | message |")
    print("|---|---|---|---|")
    for key, what, where, _fn, _types, _words in cases_faults.MISUSE:
        seen = {}
        for r in range(world_size):
            m = by_rank[r].get(key)
            out = m["outcome"] if m else ["(no record)", [], ""]
            if out is None:
                out = ["(returned)", [], ""]
            msg = out[2].split("\n")[0]
            seen.setdefault((out[0], msg.replace(f"rank {r}", "rank R")), []).append(r)
        for (etype, msg), ranks in seen.items():
            who = "all" if len(ranks) == world_size else ", ".join(map(str, ranks))
            msg = msg.replace("|", "\\|")
            print(f"| {what} | {who} | `{etype}` | {msg} |")
    if launch[0].returncode != 0:
        print(launch.report(), file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    else:
        common.main(lambda: body(float(sys.argv[1])))
