"""torch's own distributed libraries on the backend under test: FSDP2 (fully_shard),
DTensor redistribution, tensor parallelism, ZeroRedundancyOptimizer, distributed
checkpointing and the functional collectives.  Each is checked against a copy of the same
work on a gloo group over the same ranks, or against the single-process result.

These libraries reach the backend through calls the other suites test one by one
(reduce_scatter_tensor with AVG or a premultiplied sum, the coalesced all-gathers,
all_to_all_single, the object collectives); here they run in the order and with the
arguments the libraries themselves use.
"""

import copy

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from cases_ddp_parity import gloo_group

IN, HIDDEN, OUT, BATCH = 16, 40, 8, 6


def _mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, OUT))


def _batch(seed):
    """One fixed batch per rank, so that training must lower the loss."""
    g = torch.Generator().manual_seed(seed * 1000 + dist.get_rank())
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def _full(p):
    return p.full_tensor().detach().clone() if hasattr(p, "full_tensor") else p.detach().clone()


FSDP_VARIANTS = {
    # float32 gradients: FSDP2 reduce-scatters with ReduceOp.AVG
    "float32": dict(),
    "no_reshard_after_forward": dict(reshard_after_forward=False),
    # bfloat16 parameters and gradients: all-gathers and an AVG reduce-scatter in bf16
    "bfloat16": dict(mp=(torch.bfloat16, torch.bfloat16)),
    # float16 gradients: FSDP2 divides before and after a SUM reduce-scatter instead
    "float16_reduce": dict(mp=(torch.float32, torch.float16)),
}


def _fsdp_copy(base, mesh, variant):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    opts = dict(FSDP_VARIANTS[variant])
    mp = opts.pop("mp", None)
    if mp is not None:
        opts["mp_policy"] = MixedPrecisionPolicy(param_dtype=mp[0], reduce_dtype=mp[1])
    model = copy.deepcopy(base)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, **opts)
    fully_shard(model, mesh=mesh, **opts)
    return model


def fsdp2_parity(seed, variant, steps):
    """FSDP2 on the default group and on a gloo group, trained side by side.  Returns per
    step the max |p_test - p_gloo| over full parameters, and the losses."""
    base = _mlp(seed)
    test = _fsdp_copy(base, init_device_mesh("cpu", (dist.get_world_size(),)), variant)
    ref = _fsdp_copy(base, DeviceMesh.from_group(gloo_group(), "cpu"), variant)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (test, ref)]
    out = {"max_diff": [], "max_abs": [], "losses": []}
    x, y = _batch(seed)
    for _ in range(steps):
        losses = []
        for model, opt in zip((test, ref), opts):
            opt.zero_grad()
            loss = F.mse_loss(model(x).float(), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
        out["losses"].append(tuple(losses))
        pairs = [(_full(a), _full(b)) for a, b in zip(test.parameters(), ref.parameters())]
        out["max_diff"].append(max(float((a - b).abs().max()) for a, b in pairs))
        out["max_abs"].append(max(float(b.abs().max()) for _, b in pairs))
    return out


def dtensor_redistribute(seed):
    """Every redistribution between Shard(0), Shard(1), Replicate and Partial on a 1-D
    mesh, and on a 2x2 mesh when the world is 4.  Returns {label: max |full - original|};
    the Partial source holds (rank + 1) * tensor on each rank, so its original is the sum."""
    ws = dist.get_world_size()
    torch.manual_seed(seed)
    t = torch.randn(4 * ws, 3 * ws)
    mesh = init_device_mesh("cpu", (ws,))
    placements = {"S0": Shard(0), "S1": Shard(1), "R": Replicate()}
    out = {}
    for src_name, src in placements.items():
        d = distribute_tensor(t, mesh, [src])
        for dst_name, dst in placements.items():
            out[f"1d {src_name}->{dst_name}"] = float((d.redistribute(mesh, [dst]).full_tensor() - t).abs().max())
    partial = DTensor.from_local(t * (dist.get_rank() + 1), mesh, [Partial()])
    summed = t * (ws * (ws + 1) // 2)
    for dst_name, dst in placements.items():
        out[f"1d P->{dst_name}"] = float((partial.redistribute(mesh, [dst]).full_tensor() - summed).abs().max())
    mm = (distribute_tensor(t, mesh, [Shard(1)]) @ distribute_tensor(t.T.contiguous(), mesh, [Shard(0)]))
    out["1d matmul S1@S0 (partial sum)"] = float((mm.full_tensor() - t @ t.T).abs().max())
    if ws == 4:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        d = distribute_tensor(t, mesh2, [Shard(0), Shard(1)])
        out["2d S0,S1 full"] = float((d.full_tensor() - t).abs().max())
        out["2d S0,S1->R,S0"] = float((d.redistribute(mesh2, [Replicate(), Shard(0)]).full_tensor() - t).abs().max())
        out["2d S0,S1->R,R"] = float((d.redistribute(mesh2, [Replicate(), Replicate()]).to_local() - t).abs().max())
    return out


def tensor_parallel(seed):
    """Column- then row-wise parallel linear layers against the same layers unsharded:
    output and input gradient, and the sharded weights' gradients gathered."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    ref = _mlp(seed)
    tp = copy.deepcopy(ref)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    torch.manual_seed(seed + 1)  # the same batch on every rank, as tensor parallelism needs
    x = torch.randn(BATCH, IN)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ys = [m(xi) for m, xi in zip((tp, ref), xs)]
    for y in ys:
        y.pow(2).sum().backward()
    grads = {name: float((_full(p.grad) - q.grad).abs().max())
             for (name, p), q in zip(tp.named_parameters(), ref.parameters())}
    return {"output": float((ys[0] - ys[1]).abs().max()),
            "input grad": float((xs[0].grad - xs[1].grad).abs().max()),
            "max |output|": float(ys[1].abs().max()), "weight grads": grads}


def zero_parity(seed, steps):
    """ZeroRedundancyOptimizer (Adam) behind DDP, on the default group and on a gloo
    group; then the optimizer state consolidated on rank 0 over the default group."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    base = _mlp(seed)
    models = [DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base), process_group=gloo_group())]
    opts = [ZeroRedundancyOptimizer(models[0].parameters(), optimizer_class=torch.optim.Adam, lr=0.01),
            ZeroRedundancyOptimizer(models[1].parameters(), optimizer_class=torch.optim.Adam, lr=0.01,
                                    process_group=gloo_group())]
    out = {"max_diff": [], "max_abs": [], "losses": []}
    x, y = _batch(seed)
    for _ in range(steps):
        losses = []
        for model, opt in zip(models, opts):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
        out["losses"].append(tuple(losses))
        pairs = list(zip(models[0].parameters(), models[1].parameters()))
        out["max_diff"].append(max(float((a - b).abs().max()) for a, b in pairs))
        out["max_abs"].append(max(float(b.abs().max()) for _, b in pairs))
    opts[0].consolidate_state_dict(to=0)
    if dist.get_rank() == 0:
        state = opts[0].state_dict()["state"]
        out["consolidated states"] = len(state)
        out["parameters"] = len(list(base.parameters()))
    return out


def checkpoint_roundtrip(seed, path):
    """An FSDP2 model's sharded state saved with torch.distributed.checkpoint and loaded
    into a zeroed copy; returns max |loaded - saved| over full parameters, and a plain
    per-rank tensor and a replicated one through the same save and load."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    saved = _fsdp_copy(_mlp(seed), mesh, "float32")
    state = get_model_state_dict(saved)
    state["replicated"] = torch.arange(5.0)
    dcp.save(state, checkpoint_id=path)
    blank = _mlp(seed + 7)
    with torch.no_grad():
        for p in blank.parameters():
            p.zero_()
    loaded = _fsdp_copy(blank, mesh, "float32")
    target = get_model_state_dict(loaded)
    target["replicated"] = torch.zeros(5)
    dcp.load(target, checkpoint_id=path)
    replicated = target.pop("replicated")
    set_model_state_dict(loaded, target)
    diff = max(float((_full(a) - _full(b)).abs().max()) for a, b in zip(saved.parameters(), loaded.parameters()))
    return {"params": diff, "replicated": replicated.tolist()}


def functional_collectives():
    """The functional collectives (what torch.compile'd code and DTensor call) on
    rank-dependent inputs, the values returned for the parent to check."""
    rank, ws = dist.get_rank(), dist.get_world_size()
    g = dist.group.WORLD
    x = torch.arange(4, dtype=torch.float32) + 10 * rank
    out = {op: funcol.all_reduce(x, op, g).tolist() for op in ("sum", "avg", "max", "min", "product")}
    out["all_gather_tensor"] = funcol.all_gather_tensor(x, 0, g).tolist()
    out["reduce_scatter_tensor"] = funcol.reduce_scatter_tensor(torch.cat([x] * ws), "sum", 0, g).tolist()
    out["all_to_all_single"] = funcol.all_to_all_single(torch.arange(2 * ws, dtype=torch.float32) + 100 * rank,
                                                         None, None, g).tolist()
    out["broadcast"] = funcol.broadcast(x, 0, g).tolist()
    out["all_reduce_coalesced"] = [t.tolist() for t in funcol.all_reduce_coalesced([x, 2 * x], "sum", g)]
    out["all_gather_into_tensor_coalesced"] = [
        t.tolist() for t in funcol.all_gather_into_tensor_coalesced([x, 2 * x], g)]
    out["reduce_scatter_tensor_coalesced"] = [
        t.tolist() for t in funcol.reduce_scatter_tensor_coalesced([torch.cat([x] * ws), torch.cat([2 * x] * ws)],
                                                                   "sum", [0, 0], g)]
    return out


def compiled_functional_collectives(backend):
    """A function of functional collectives compiled by torch.compile (`backend`), on
    rank-dependent inputs: returns (compiled result, eager result)."""
    import torch._dynamo

    def step(x):
        y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
        z = funcol.all_gather_tensor(y + 1, 0, dist.group.WORLD)
        return funcol.reduce_scatter_tensor(z.repeat(dist.get_world_size()), "sum", 0, dist.group.WORLD) - z

    torch._dynamo.reset()
    x = torch.arange(6, dtype=torch.float32) + 10 * dist.get_rank()
    return torch.compile(step, backend=backend, fullgraph=True)(x).tolist(), step(x).tolist()
