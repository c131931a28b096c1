"""broadcast case bodies, run on every rank by harness.World.run."""

import torch.distributed as dist

import refs


def broadcast_roots(seed, count, dtype, roots):
    """broadcast from each root in turn; {root: tensor after the call}.

    The root sends its make_input(seed, root, ...) tensor; every other rank starts from a
    tensor that differs from it in every element, so a missed write shows.
    """
    rank = dist.get_rank()
    out = {}
    for root in roots:
        x = refs.make_input(seed, root, dtype, count)
        if rank != root:
            x = refs.perturb(x)
        dist.broadcast(x, src=root)
        out[root] = x
    return out
