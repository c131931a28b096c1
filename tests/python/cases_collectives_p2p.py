"""Point-to-point case bodies: tags, recv from any source, batch_isend_irecv, blocking
send/recv.  Rank src's message to rank dst under tag t is message(seed, name, src, dst, t)
so the parent rebuilds every expected message.
"""

import random

import torch
import torch.distributed as dist

import refs


def message(seed, name, src, dst, tag, dtype, n):
    return refs.make_input(refs.seed_for(seed, "p2p", name, src, dst, tag), 0, dtype, n)


def tagged_exchange(seed, dtype, tag_counts):
    """Every rank isends one message per tag to every other rank (tags interleaved, in the
    order given), then receives them with blocking recv in a shuffled (rank-dependent) tag
    order, so only tag matching can pair them up.  Sizes differ per tag.

    tag_counts: [(tag, count)].  Returns {(src, tag): received tensor}.
    """
    rank, ws = dist.get_rank(), dist.get_world_size()
    peers = [p for p in range(ws) if p != rank]

    def run(_):
        works = []
        for tag, count in tag_counts:
            for dst in peers:
                t = message(seed, "tags", rank, dst, tag, dtype, count)
                works.append((t, dist.isend(t, dst=dst, tag=tag)))
        order = [(src, tag, count) for src in peers for tag, count in tag_counts]
        random.Random(f"{seed}:{rank}").shuffle(order)
        out = {}
        for src, tag, count in order:
            buf = refs.perturb(message(seed, "tags", src, rank, tag, dtype, count))
            dist.recv(buf, src=src, tag=tag)
            out[(src, tag)] = buf
        for _, w in works:
            w.wait()
        return out

    res = refs.run_until_error(["tags"], run)
    return res.get("tags", res)


def any_source(seed, dtype, count, receiver, tags=(1, 2)):
    """Every rank but `receiver` isends one message per tag to `receiver`; the receiver
    takes them with recv(src=None, tag=t), the last tag first, and records the sender rank
    recv returns.  Returns on the receiver [(tag, returned sender, tensor)], else []."""
    rank, ws = dist.get_rank(), dist.get_world_size()

    def run(_):
        if rank != receiver:
            works = []
            for tag in tags:
                t = message(seed, "any", rank, receiver, tag, dtype, count)
                works.append((t, dist.isend(t, dst=receiver, tag=tag)))
            for _, w in works:
                w.wait()
            return []
        got = []
        for tag in reversed(tags):
            for _ in range(ws - 1):
                buf = torch.empty(count, dtype=refs.DTYPES[dtype])
                sender = dist.recv(buf, src=None, tag=tag)
                got.append((tag, sender, buf))
        return got

    res = refs.run_until_error(["any"], run)
    return res.get("any", res)


def batch_ring(seed, dtype, counts, tag=0):
    """dist.batch_isend_irecv: send to both ring neighbours and receive from both, one
    batch per count.  {(count, "from_prev" | "from_next"): tensor}."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws

    def one(count):
        # direction is part of the message name so that ws == 2 (next == prev) still tells
        # the two messages apart; they are paired by tag
        to_next = message(seed, "batch-fwd", rank, nxt, tag, dtype, count)
        to_prev = message(seed, "batch-bwd", rank, prv, tag + 1, dtype, count)
        from_prev = refs.perturb(message(seed, "batch-fwd", prv, rank, tag, dtype, count))
        from_next = refs.perturb(message(seed, "batch-bwd", nxt, rank, tag + 1, dtype, count))
        ops = [
            dist.P2POp(dist.isend, to_next, peer=nxt, tag=tag),
            dist.P2POp(dist.irecv, from_prev, peer=prv, tag=tag),
            dist.P2POp(dist.isend, to_prev, peer=prv, tag=tag + 1),
            dist.P2POp(dist.irecv, from_next, peer=nxt, tag=tag + 1),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return {"from_prev": from_prev, "from_next": from_next}

    return refs.run_until_error(list(counts), one)


def blocking_ping_pong(seed, dtype, counts):
    """Rank 0 and each other rank in turn: 0 sends (blocking), the peer receives and sends
    its own message back.  {(peer, count): tensor received by this rank}."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    keys = [(peer, count) for peer in range(1, ws) for count in counts]

    def one(key):
        peer, count = key
        if rank == 0:
            dist.send(message(seed, "pp", 0, peer, 0, dtype, count), dst=peer)
            buf = refs.perturb(message(seed, "pp", peer, 0, 0, dtype, count))
            dist.recv(buf, src=peer)
            return buf
        if rank == peer:
            buf = refs.perturb(message(seed, "pp", 0, peer, 0, dtype, count))
            dist.recv(buf, src=0)
            dist.send(message(seed, "pp", peer, 0, 0, dtype, count), dst=0)
            return buf
        return None

    return refs.run_until_error(keys, one)
