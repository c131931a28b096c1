"""all_to_all (list) and all_to_all_single (equal and uneven splits) case bodies.

Rank i's message to rank j is refs.make_input(seed_for(seed, <variant>, i, j), 0, dtype, n)
with n = splits(i, j) elements, so the parent rebuilds exactly what rank j must receive.
"""

import torch
import torch.distributed as dist

import refs

# Uneven split patterns: n(src, dst) elements go from rank src to rank dst.
SPLIT_PATTERNS = {
    # every message `count` elements (input_split_sizes=None, the equal-split form)
    "equal": None,
    # the same, spelled with explicit equal split lists
    "equal_explicit": lambda src, dst, ws, count: count,
    # sizes 0..6 depending on the pair; src == dst and some other pairs send nothing
    "uneven": lambda src, dst, ws, count: (3 * src + 5 * dst + 1) % 7 if src != dst else 0,
    # one rank sends nothing and another receives nothing
    "zeros": lambda src, dst, ws, count: 0 if src == 0 or dst == ws - 1 else src + dst + 1,
    # large and uneven
    "large_uneven": lambda src, dst, ws, count: count + 97 * ((src + 2 * dst) % ws),
    # rank 0 sends `count` to every rank, the others one element: with a large count, rank
    # 0's input is read in place where the others' go through their slots (single copy)
    "lopsided": lambda src, dst, ws, count: count if src == 0 else 1,
    # rank 0 passes no split sizes (it sends and receives `count` per peer); the others pass
    # them, uneven between each other (as gloo allows)
    "mixed": lambda src, dst, ws, count: (count if 0 in (src, dst) or src == dst
                                          else count + 1 + (src + 2 * dst) % 3),
}


def msg(seed, name, src, dst, dtype, n):
    """Rank src's message to rank dst (n elements) in the exchange called `name`."""
    return refs.make_input(refs.seed_for(seed, "a2a", name, src, dst), 0, dtype, n)


def split(variant, src, dst, ws, count):
    f = SPLIT_PATTERNS[variant]
    return count if f is None else f(src, dst, ws, count)


def expected_received(seed, variant, dst, ws, dtype, count, name=None):
    """What rank dst receives: the messages from every src, in src order, concatenated."""
    name = name or variant
    return torch.cat([msg(seed, name, src, dst, dtype, split(variant, src, dst, ws, count))
                      for src in range(ws)])


def all_to_all_single_variants(seed, dtype, variants):
    """{(variant, count): received tensor} for each (variant, count) in `variants`."""
    rank, ws = dist.get_rank(), dist.get_world_size()

    def one(key):
        variant, count = key
        sends = [split(variant, rank, dst, ws, count) for dst in range(ws)]
        recvs = [split(variant, src, rank, ws, count) for src in range(ws)]
        inp = torch.cat([msg(seed, variant, rank, dst, dtype, sends[dst]) for dst in range(ws)])
        out = refs.perturb(expected_received(seed, variant, rank, ws, dtype, count))
        if variant == "equal" or (variant == "mixed" and rank == 0):
            dist.all_to_all_single(out, inp)
        else:
            dist.all_to_all_single(out, inp, output_split_sizes=recvs, input_split_sizes=sends)
        return out

    return refs.run_until_error([tuple(v) for v in variants], one)


def all_to_all_single_2d(seed, dtype, rows_per_peer, cols):
    """all_to_all_single on a [ws * rows_per_peer, cols] tensor (splits along dim 0)."""
    rank, ws = dist.get_rank(), dist.get_world_size()

    def one(_):
        n = rows_per_peer * cols
        inp = torch.cat([msg(seed, "2d", rank, dst, dtype, n) for dst in range(ws)]).view(-1, cols)
        out = refs.perturb(torch.cat([msg(seed, "2d", src, rank, dtype, n)
                                      for src in range(ws)])).view(-1, cols)
        dist.all_to_all_single(out, inp)
        return out.reshape(-1)

    return refs.run_until_error(["2d"], one)


def all_to_all_list_variants(seed, dtype, variants, form="separate"):
    """{(variant, count): concatenation of the received list} for dist.all_to_all.

    form "separate": every input and output its own tensor; "views": the split views of
    one input and one output tensor (read and written in place, not packed).
    """
    rank, ws = dist.get_rank(), dist.get_world_size()

    def one(key):
        variant, count = key
        name = "list-" + variant
        inputs = [msg(seed, name, rank, dst, dtype, split(variant, rank, dst, ws, count))
                  for dst in range(ws)]
        outputs = [refs.perturb(msg(seed, name, src, rank, dtype,
                                    split(variant, src, rank, ws, count)))
                   for src in range(ws)]
        if form == "views":
            inputs = list(torch.cat(inputs).split([t.numel() for t in inputs]))
            out = torch.cat(outputs)
            outputs = list(out.split([t.numel() for t in outputs]))
            dist.all_to_all(outputs, inputs)
            return out
        dist.all_to_all(outputs, inputs)
        return torch.cat(outputs)

    return refs.run_until_error([tuple(v) for v in variants], one)
