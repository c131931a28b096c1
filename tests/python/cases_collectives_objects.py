"""Object collectives: all_gather_object, gather_object, broadcast_object_list,
scatter_object_list.  Objects are plain picklable Python values whose content and pickled
size depend on the rank (so the size exchange and padding matter)."""

import torch.distributed as dist

import refs


def obj(seed, tag, rank):
    """A rank-specific object; its pickle grows with the rank (0 to ~2 kB)."""
    return {"tag": tag, "rank": rank, "seed": seed, "payload": "x" * (rank * 97 % 2000),
            "nums": list(range(rank * 3)), "nested": ({"r": rank}, (rank, str(rank)))}


def object_collectives(seed, roots):
    rank, ws = dist.get_rank(), dist.get_world_size()
    keys = [("all_gather_object", None)]
    for root in roots:
        keys += [("gather_object", root), ("broadcast_object_list", root),
                 ("scatter_object_list", root)]

    def one(key):
        what, root = key
        if what == "all_gather_object":
            out = [None] * ws
            dist.all_gather_object(out, obj(seed, what, rank))
            return out
        if what == "gather_object":
            out = [None] * ws if rank == root else None
            dist.gather_object(obj(seed, what, rank), out, dst=root)
            return out
        if what == "broadcast_object_list":
            # three objects of different sizes from the root; others start from placeholders
            if rank == root:
                lst = [obj(seed, what, root), obj(seed, what, root + 100), None]
            else:
                lst = ["placeholder"] * 3
            dist.broadcast_object_list(lst, src=root)
            return lst
        if what == "scatter_object_list":
            out = [None]
            inputs = [obj(seed, what, i) for i in range(ws)] if rank == root else None
            dist.scatter_object_list(out, inputs, src=root)
            return out[0]
        raise ValueError(what)

    return refs.run_until_error(keys, one)
