"""ringx.monitored_barrier names the ranks that did not arrive.

    monitored.py MISSING TIMEOUT_S WAIT_ALL [HOW [LATE]]

MISSING   comma-separated ranks that skip the barrier.
WAIT_ALL  1: wait_all_ranks=True (every missing rank named), 0: only the first.
HOW       sleep (default): the missing ranks sleep past the timeout, then leave;
          exit: they leave at once, their process ending (os._exit(0)) without
          destroying the group, so rank 0 hears their connections close.
LATE      comma-separated ranks that arrive 0.4 x TIMEOUT_S late (within the timeout).
Label "barrier": what ringx.monitored_barrier(timeout=TIMEOUT_S) raised on each
arriving rank.  A first barrier with every rank present must pass ("all_present").
"""

import os
import sys
import time

import faultlib as common

MISSING = {int(x) for x in sys.argv[1].split(",") if x}
TIMEOUT_S = float(sys.argv[2])
WAIT_ALL = sys.argv[3] == "1"
HOW = sys.argv[4] if len(sys.argv) > 4 else "sleep"
LATE = {int(x) for x in sys.argv[5].split(",") if x} if len(sys.argv) > 5 else set()


def body():
    import datetime

    import ringx

    dist = common.setup(TIMEOUT_S * 4)
    r = dist.get_rank()
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    common.attempt("all_present", lambda: ringx.monitored_barrier(timeout=timeout))
    if r in MISSING and HOW == "exit":
        common.record("leaving")
        sys.stdout.flush()
        os._exit(0)
    if r in MISSING:
        time.sleep(TIMEOUT_S * 1.5)
    else:
        if r in LATE:
            time.sleep(TIMEOUT_S * 0.4)
        common.attempt("barrier",
                       lambda: ringx.monitored_barrier(timeout=timeout, wait_all_ranks=WAIT_ALL))
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
