"""send / recv with tags (interleaved, received out of order, matched by tag), recv from
any source (src=None returns the sender's rank), dist.batch_isend_irecv, and blocking
send/recv, over world sizes 2-8 and several dtypes and sizes (0, 1, prime, large)."""

import os

import pytest

import cases_collectives_p2p as cases
import refs

SEED = int(os.environ.get("RINGX_TEST_SEED", "20240611"))
LARGE = 2**18 + 1
DTYPES = ("float32", "bfloat16", "int64", "uint8", "bool")


def _params(world_sizes, dtypes, ws8_dtypes=("float32",)):
    return [pytest.param(ws, d, id=f"ws{ws}-{d}") for ws in world_sizes
            for d in (ws8_dtypes if ws == 8 else dtypes)]


def _tag_counts(ws, dtype):
    tc = [(7, 13), (3, 1), (11, 0), (0, 5)]
    if ws in (2, 3) and dtype == "float32":
        tc.append((5, LARGE))
    return tc


@pytest.mark.parametrize("ws,dtype", _params((2, 3, 4, 8), DTYPES))
def test_send_recv_tags(worlds, ws, dtype):
    tag_counts = _tag_counts(ws, dtype)
    results = worlds.run(ws, cases.tagged_exchange, seed=SEED, dtype=dtype, tag_counts=tag_counts)
    failures = refs.errors_of(results, f"tagged send/recv {dtype} world {ws}")
    for dst in range(ws):
        if refs.ERROR_KEY in results[dst]:
            continue
        for src in range(ws):
            if src == dst:
                continue
            for tag, count in tag_counts:
                got = results[dst].get((src, tag))
                expected = cases.message(SEED, "tags", src, dst, tag, dtype, count)
                msg = refs.compare(got, expected, None,
                                   f"rank {dst}: recv from {src} tag {tag} ({dtype} count {count}) "
                                   f"world {ws}", dtype)
                if msg:
                    failures.append(msg)
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws,dtype", _params((2, 3, 4, 8), ("float32", "int64")))
def test_recv_any_source(worlds, ws, dtype):
    count = 13
    tags = (1, 2)
    failures = []
    for receiver in sorted({0, ws - 1}):
        results = worlds.run(ws, cases.any_source, seed=SEED, dtype=dtype, count=count,
                             receiver=receiver, tags=tags)
        failures += refs.errors_of(results, f"recv(src=None) to {receiver} {dtype} world {ws}")
        got = results[receiver]
        if not isinstance(got, list):
            continue
        where = f"rank {receiver}: recv(src=None) {dtype} world {ws}"
        for tag in tags:
            mine = [(sender, t) for tg, sender, t in got if tg == tag]
            senders = sorted(s for s, _ in mine)
            want = sorted(r for r in range(ws) if r != receiver)
            if senders != want:
                failures.append(f"{where}: tag {tag}: recv returned senders {senders}, "
                                f"expected each of {want} once")
            for sender, t in mine:
                if not isinstance(sender, int) or not 0 <= sender < ws:
                    continue
                msg = refs.compare(t, cases.message(SEED, "any", sender, receiver, tag, dtype,
                                                    count), None,
                                   f"{where}: tag {tag}: data of the message recv attributed to "
                                   f"rank {sender}", dtype)
                if msg:
                    failures.append(msg)
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws,dtype", _params((2, 3, 4, 8), ("float32", "bfloat16", "bool")))
def test_batch_isend_irecv(worlds, ws, dtype):
    counts = (0, 1, 13) + ((LARGE,) if ws == 3 and dtype == "float32" else ())
    results = worlds.run(ws, cases.batch_ring, seed=SEED, dtype=dtype, counts=counts, tag=4)
    failures = refs.errors_of(results, f"batch_isend_irecv {dtype} world {ws}")
    for r in range(ws):
        nxt, prv = (r + 1) % ws, (r - 1) % ws
        for count in counts:
            if count not in results[r]:
                continue
            for key, expected in (
                ("from_prev", cases.message(SEED, "batch-fwd", prv, r, 4, dtype, count)),
                ("from_next", cases.message(SEED, "batch-bwd", nxt, r, 5, dtype, count)),
            ):
                msg = refs.compare(results[r][count][key], expected, None,
                                   f"rank {r}: batch_isend_irecv {key} {dtype} count {count} "
                                   f"world {ws}", dtype)
                if msg:
                    failures.append(msg)
    assert not failures, refs.report(failures)


@pytest.mark.parametrize("ws,dtype", _params((2, 3), ("float32", "int64", "bool")))
def test_blocking_send_recv(worlds, ws, dtype):
    counts = (0, 1, 13) + ((LARGE,) if dtype == "float32" else ())
    results = worlds.run(ws, cases.blocking_ping_pong, seed=SEED, dtype=dtype, counts=counts)
    failures = refs.errors_of(results, f"send/recv {dtype} world {ws}")
    for peer in range(1, ws):
        for count in counts:
            for r, src in ((0, peer), (peer, 0)):
                if (peer, count) not in results[r]:
                    continue
                msg = refs.compare(results[r][(peer, count)],
                                   cases.message(SEED, "pp", src, r, 0, dtype, count), None,
                                   f"rank {r}: recv from {src}, {dtype} count {count} world {ws}",
                                   dtype)
                if msg:
                    failures.append(msg)
    assert not failures, refs.report(failures)
