"""DDP parity: one model, seed and data, trained with two DDP copies in the same world:
one on the default group (the backend under test) and one on a gloo group over the same
ranks (dist.new_group(backend="gloo")), compared parameter by parameter after every step.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN, HIDDEN, OUT, BATCH = 16, 48, 4, 8
VOCAB, BAG = 40, 5


class Net(nn.Module):
    """Three layers plus, for the unused-parameter variants, a layer forward never uses
    and a branch used only on even steps; for the sparse variant, an embedding bag with
    sparse gradients in front (its input is token ids)."""

    def __init__(self, with_unused, sparse=False):
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, IN, mode="mean", sparse=True) if sparse else None
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.fc3 = nn.Linear(HIDDEN, OUT)
        self.with_unused = with_unused
        if with_unused:
            self.never_used = nn.Linear(HIDDEN, HIDDEN)
            self.even_steps_only = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x, step=0):
        if self.embed is not None:
            x = self.embed(x)
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.fc2(h))
        if self.with_unused and step % 2 == 0:
            h = h + torch.tanh(self.even_steps_only(h))
        return self.fc3(h)


VARIANTS = {
    "default": dict(),
    "gradient_as_bucket_view": dict(gradient_as_bucket_view=True),
    "static_graph": dict(static_graph=True),
    "find_unused_parameters": dict(find_unused_parameters=True),
    # The embedding's gradient is a sparse COO tensor: DDP all-reduces it on its own.
    "sparse_embedding": dict(),
}


_GLOO = {}  # world size -> the gloo group over every rank, created once per worker


def gloo_group():
    """One gloo group over every rank, kept for the life of the worker.

    Not destroyed after each case: dropping the last reference to a ProcessGroupGloo runs
    its destructor with the GIL held, and that destructor joins gloo's worker threads,
    one of which may still be releasing the last DDP bucket's tensors (which takes the
    GIL).  That deadlocked about one case in four; the harness's destroy_process_group()
    at shutdown, long after the last collective, is safe.  Every rank reaches the first
    call in the same case, so new_group is called collectively.
    """
    ws = dist.get_world_size()
    if ws not in _GLOO:
        _GLOO[ws] = dist.new_group(list(range(ws)), backend="gloo")
    return _GLOO[ws]


def ddp_parity(seed, variant, steps, lr=0.05, bucket_cap_mb=0.01):
    """Train both copies `steps` steps.  Returns {"max_diff": [per step: max over params
    of max |p_test - p_gloo|], "max_abs": [per step: max |p_gloo|], "losses": [(test,
    gloo)], "params": final test-copy parameters, "gloo_params": final gloo-copy ones}.

    bucket_cap_mb is small so that each backward launches several bucket all-reduces.
    """
    rank = dist.get_rank()
    gloo = gloo_group()
    with_unused = variant == "find_unused_parameters"
    sparse = variant == "sparse_embedding"
    torch.manual_seed(seed)
    base = Net(with_unused, sparse)
    kwargs = dict(VARIANTS[variant], bucket_cap_mb=bucket_cap_mb)
    model_t = DDP(copy.deepcopy(base), **kwargs)  # default group: the backend under test
    model_g = DDP(copy.deepcopy(base), process_group=gloo, **kwargs)
    momentum = 0.0 if sparse else 0.9
    opt_t = torch.optim.SGD(model_t.parameters(), lr=lr, momentum=momentum)
    opt_g = torch.optim.SGD(model_g.parameters(), lr=lr, momentum=momentum)
    out = {"max_diff": [], "max_abs": [], "losses": []}
    # one fixed batch per rank (so the loss must go down), different on every rank
    g = torch.Generator().manual_seed(seed * 100003 + rank)
    x = torch.randint(0, VOCAB, (BATCH, BAG), generator=g) if sparse else torch.randn(BATCH, IN, generator=g)
    y = torch.randn(BATCH, OUT, generator=g)
    for step in range(steps):
        losses = []
        for model, opt in ((model_t, opt_t), (model_g, opt_g)):
            opt.zero_grad()
            loss = F.mse_loss(model(x, step) if with_unused else model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
        out["losses"].append(tuple(losses))
        diffs, mags = [], []
        for pt, pg in zip(model_t.parameters(), model_g.parameters()):
            diffs.append(float((pt.detach() - pg.detach()).abs().max()))
            mags.append(float(pg.detach().abs().max()))
        out["max_diff"].append(max(diffs))
        out["max_abs"].append(max(mags))
    out["params"] = [p.detach().clone() for p in model_t.parameters()]
    out["gloo_params"] = [p.detach().clone() for p in model_g.parameters()]
    return out
