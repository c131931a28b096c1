"""ringx.monitored_barrier names the ranks that did not arrive.

    monitored.py MISSING TIMEOUT_S WAIT_ALL

MISSING   comma-separated ranks that skip the barrier (they sleep, then leave).
WAIT_ALL  1: wait_all_ranks=True (every missing rank named), 0: only the first.
Label "barrier": what ringx.monitored_barrier(timeout=TIMEOUT_S) raised on each
arriving rank.  A first barrier with every rank present must pass ("all_present").
"""

import sys
import time

import faultlib as common

MISSING = {int(x) for x in sys.argv[1].split(",") if x}
TIMEOUT_S = float(sys.argv[2])
WAIT_ALL = sys.argv[3] == "1"


def body():
    import datetime

    import ringx

    dist = common.setup(TIMEOUT_S * 4)
    r = dist.get_rank()
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    common.attempt("all_present", lambda: ringx.monitored_barrier(timeout=timeout))
    if r in MISSING:
        time.sleep(TIMEOUT_S * 1.5)
    else:
        common.attempt("barrier",
                       lambda: ringx.monitored_barrier(timeout=timeout, wait_all_ranks=WAIT_ALL))
    common.finish(dist)


if __name__ == "__main__":
    common.main(body)
