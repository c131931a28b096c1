"""DDP communication-hook case bodies, run on every rank by harness.World.run.

Every case trains a tiny MLP with DDP.  The model under test runs on the default
group (the backend under test) with the hook under test; the reference is a second
DDP copy of the same model on a gloo group over all ranks (``dist.new_group(
backend="gloo")``) with torch's default ``allreduce_hook``.  Both copies start from the
same weights and see the same per-rank data, so after N steps their parameters should
agree (exact hooks) or their losses should be close (compressing hooks).  The parent
(test_hooks.py) does the comparing; cases return plain data.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.distributed.algorithms.ddp_comm_hooks import quantization_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import harness
import ringx.hooks

IN, HIDDEN, OUT = 16, 48, 4
BATCH = 16

_GROUPS = {}


def _group(name, backend):
    """A group over all ranks on `backend`, created once per world under `name`.

    Cases run on every rank in the same order, so the ranks create these groups in
    the same order too (new_group is collective).
    """
    if name not in _GROUPS:
        _GROUPS[name] = dist.new_group(backend=backend)
    return _GROUPS[name]


def _gloo():
    """The reference group: gloo over all ranks."""
    return _group("ref", "gloo")


def _side():
    """A second group of the backend under test, for collectives issued from callbacks."""
    return _group("side", harness.BACKEND)


def _model(seed, depth=3):
    torch.manual_seed(seed)
    layers, width = [], IN
    for _ in range(depth):
        layers += [nn.Linear(width, HIDDEN), nn.Tanh()]
        width = HIDDEN
    layers.append(nn.Linear(width, OUT))
    return nn.Sequential(*layers)


def _teacher(seed):
    g = torch.Generator().manual_seed(seed + 7)
    return torch.randn(IN, OUT, generator=g) / IN**0.5


def _batches(seed, rank, steps):
    """The same per-rank data for every copy: (x, y) for each step."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    w = _teacher(seed)
    for _ in range(steps):
        x = torch.randn(BATCH, IN, generator=g)
        yield x, torch.sin(x @ w)


def _eval_loss(model, seed):
    """Loss on a fixed batch, the same on every rank."""
    g = torch.Generator().manual_seed(seed + 12345)
    x = torch.randn(256, IN, generator=g)
    y = torch.sin(x @ _teacher(seed))
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), y))


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


class _Recorder:
    """Wraps a hook: counts buckets and checks the result is written into the bucket.

    Register ``recorder.hook`` (DDP wants a function with a __name__ and a parameter
    named ``bucket``)."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0
        self.sizes = set()
        self.in_place = []  # result tensor is the bucket's buffer (same storage, dtype)

    def hook(self, state, bucket):
        self.calls += 1
        buf = bucket.buffer()
        self.sizes.add(buf.numel())

        def check(fut):
            out = fut.value()
            self.in_place.append(out.data_ptr() == buf.data_ptr() and out.dtype == buf.dtype)
            return out

        return self.inner(state, bucket).then(check)


_CHAIN_SIDE = []


def _chained(state, bucket):
    """ringx's allreduce_hook with three .then callbacks, one of which runs a collective.

    The callback's collective runs on a second group of the backend under test and is
    waited on with Work.wait(); it is a SUM of ones, so its result does not depend on
    which bucket's callback it pairs with on the other ranks.
    """
    side = _side()

    def times3(fut):
        return fut.value().mul_(3)

    def side_collective(fut):
        one = torch.ones(1)
        dist.all_reduce(one, group=side, async_op=True).wait()
        _CHAIN_SIDE.append(float(one))
        return fut.value()

    def div3(fut):
        return fut.value().div_(3)

    return ringx.hooks.allreduce_hook(state, bucket).then(times3).then(side_collective).then(div3)


RINGX_HOOKS = {
    "allreduce": ringx.hooks.allreduce_hook,
    "bf16": ringx.hooks.bf16_compress_hook,
    "fp16": ringx.hooks.fp16_compress_hook,
    "chained": _chained,
}


def _train(ddp, batches, lr):
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()


def ringx_hook_vs_gloo(hook, steps, seed, bucket_cap_mb, lr=0.05, explicit_group=False):
    """Train with RINGX_HOOKS[hook] on the default group and with torch's default
    allreduce_hook on a gloo group, in lockstep. Returns parameters, losses, bucket info.

    explicit_group: register the hook with state=dist.group.WORLD instead of None."""
    rank = dist.get_rank()
    gloo = _gloo()
    if hook == "chained":
        _side()  # create the side group here, before any callback needs it
    _CHAIN_SIDE.clear()
    test_model, ref_model = _model(seed), _model(seed)
    test = DDP(test_model, bucket_cap_mb=bucket_cap_mb)
    ref = DDP(ref_model, process_group=gloo, bucket_cap_mb=bucket_cap_mb)
    rec = _Recorder(RINGX_HOOKS[hook])
    test.register_comm_hook(dist.group.WORLD if explicit_group else None, rec.hook)
    ref.register_comm_hook(gloo, default_hooks.allreduce_hook)
    init_loss = _eval_loss(test_model, seed)
    opt_t = torch.optim.SGD(test.parameters(), lr=lr, momentum=0.9)
    opt_r = torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.9)
    for x, y in _batches(seed, rank, steps):
        for ddp, opt in ((test, opt_t), (ref, opt_r)):
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    return {
        "test": _flat(test_model), "ref": _flat(ref_model),
        "test_loss": _eval_loss(test_model, seed), "ref_loss": _eval_loss(ref_model, seed),
        "init_loss": init_loss, "calls": rec.calls, "sizes": sorted(rec.sizes),
        "in_place": len(rec.in_place) == rec.calls and all(rec.in_place),
        "side": list(_CHAIN_SIDE),
    }


def _torch_hook(name, group):
    """(state, hook) for torch's hook `name` on `group`; a fresh state per model."""
    if name == "allreduce":
        return group, default_hooks.allreduce_hook
    if name == "fp16":
        return group, default_hooks.fp16_compress_hook
    if name in ("powerSGD", "batched_powerSGD"):
        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2, random_seed=0)
        hook = psgd.powerSGD_hook if name == "powerSGD" else psgd.batched_powerSGD_hook
        return state, hook
    if name == "quantization_pertensor":
        return group, quantization_hooks.quantization_pertensor_hook
    raise ValueError(name)


def torch_hook_both(hook, steps, seed, bucket_cap_mb, lr=0.05):
    """Train with torch's hook `hook` on the default group, then on a gloo group.

    The two runs are sequential (not interleaved) so that a failure in one cannot leave
    collectives of the other half-issued.  Errors are returned, not raised.
    """
    rank = dist.get_rank()
    gloo = _gloo()
    out = {}
    for label, group in (("test", None), ("ref", gloo)):
        model = _model(seed)
        ddp = DDP(model, process_group=group, bucket_cap_mb=bucket_cap_mb)
        state, fn = _torch_hook(hook, group)
        ddp.register_comm_hook(state, fn)
        try:
            _train(ddp, _batches(seed, rank, steps), lr)
            out[label + "_error"] = None
        except Exception as e:  # noqa: BLE001 - reported to the parent
            out[label + "_error"] = f"{type(e).__name__}: {str(e).strip()[:2000]}"
        out[label] = _flat(model)
        out[label + "_loss"] = _eval_loss(model, seed)
        dist.barrier(group=gloo)  # line the ranks up again after a failed step
    return out


def profiled_step(seed, bucket_cap_mb):
    """One DDP step with ringx.hooks.allreduce_hook and a few plain collectives under
    torch.profiler. Returns the backend's events {name: [count, [input shapes]]} and
    the bucket sizes of the profiled step."""
    from torch.profiler import ProfilerActivity, profile

    rank = dist.get_rank()
    model = _model(seed)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    rec = _Recorder(ringx.hooks.allreduce_hook)
    ddp.register_comm_hook(None, rec.hook)
    batches = list(_batches(seed, rank, 3))
    _train(ddp, batches[:2], 0.01)  # DDP rebuilds its buckets after the first step
    rec.sizes.clear()
    ws = dist.get_world_size()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _train(ddp, batches[2:], 0.01)
        t = torch.ones(1000)
        dist.all_reduce(t)
        dist.all_gather([torch.empty(1000) for _ in range(ws)], t)
        dist.broadcast(t, 0)
    prefix = harness.BACKEND + ":"
    events = {}
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key.startswith(prefix):
            entry = events.setdefault(e.key, [0, []])
            entry[0] += e.count
            entry[1].append(e.input_shapes)
    return {"events": events, "bucket_sizes": sorted(rec.sizes)}
