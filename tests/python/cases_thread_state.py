"""Case bodies: collectives whose results are copied into the caller's tensors on
ringx's progress thread, issued under autograd states that thread does not share."""

import torch
import torch.distributed as dist


def results_under_inference_mode_and_requires_grad():
    """Non-contiguous outputs (so the result is copied back on the progress thread)
    created and filled under torch.inference_mode(), and views of tensors that require
    grad; returns what each call left in them, and what the caller's threads saw."""
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    with torch.inference_mode():
        base = torch.full((4, 6), float(r + 1))
        t = base[:, ::2]
        dist.all_reduce(t)
        out["inference_all_reduce"] = base.tolist()
        g = torch.zeros(n, 3, 2).transpose(1, 2)
        dist.all_gather_into_tensor(g, torch.full((2, 3), float(r + 1)))
        out["inference_all_gather"] = g.tolist()
        b = torch.zeros(6, 4)[:, 1]
        if r == 0:
            b.copy_(torch.arange(6, dtype=torch.float32))
        dist.broadcast(b, 0, async_op=True).wait()
        out["inference_broadcast"] = b.tolist()
    leaf = torch.full((4, 6), float(r + 1), requires_grad=True)
    with torch.no_grad():
        view = leaf[:, ::2]
        dist.all_reduce(view)
    out["requires_grad_all_reduce"] = leaf.detach().tolist()
    out["requires_grad_still"] = leaf.requires_grad
    x = torch.full((3, 4), float(r + 1), requires_grad=True)
    y = (x * 1).t()  # a non-leaf, non-contiguous tensor in the autograd graph
    dist.all_reduce(y)
    out["non_leaf_all_reduce"] = y.detach().t().tolist()
    out["grad_mode_after"] = torch.is_grad_enabled()
    out["inference_mode_after"] = torch.is_inference_mode_enabled()
    return out
