"""What a model pays per call and per training step: ``python -m ops.bench calls`` and ``python -m ops.bench model``.

``calls``: wall clock per call of each public op on small inputs, building the graph and running it with a sync
after every call (as a training loop meets it), next to jittor's nearest built-in and PyTorch eager, in one
process. ``model``: ms per training step (forward, backward, SGD update) of two models: a 3-D CNN (conv3d
3->32->64->128, each with ReLU and MaxPool3d(2), on (8, 3, 16, 112, 112)) with ``ops.MaxPool3d`` against the
same model with ``jt.nn.MaxPool3d`` and PyTorch's, all from the same parameters (their first losses agree), and
an RWKV-style time-mix block with ``ops.timex`` against the naive jittor composite and PyTorch's causal
``conv1d``. ``model --data-parallel`` under ``mpirun -np N``: the 3-D CNN on N GPUs through jittor's MPI.

Medians of several rounds, ops, jittor and PyTorch timed in interleaved rounds; the first calls (compiles) are
excluded. Times move with the machine's load: compare columns of one run, not runs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def _per_call_us(fn, sync, calls: int, rounds: int = 5) -> float:
    return _interleaved_us([(fn, sync)], calls, rounds)[0][0]


def _interleaved_us(calls_and_syncs, calls: int, rounds: int = 7):
    """Per-call us of each (fn, sync), timed in interleaved rounds (a round of each in turn, so that a slow spell
    of the machine touches all of them alike): the median of each, and the median over rounds of the first's
    time over the second's (on a shared 2-core machine the sequential medians of ops and jittor once moved 1.7x
    from run to run, the ratio far less)."""
    for fn, sync in calls_and_syncs:
        for _ in range(max(3, calls // 10)):
            sync(fn())
    times = [[] for _ in calls_and_syncs]
    for _ in range(rounds):
        for (fn, sync), record in zip(calls_and_syncs, times):
            start = time.perf_counter()
            for _ in range(calls):
                sync(fn())
            record.append((time.perf_counter() - start) / calls * 1e6)
    medians = [statistics.median(t) for t in times]
    ratio = statistics.median(a / b for a, b in zip(times[0], times[1])) if len(times) > 1 else None
    return medians, ratio


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


class CallKit:
    """What a family's bench rows are built from: the modules, the device, and makers of inputs and steps."""

    def __init__(self, jt, ops, np, torch, cuda: bool):
        self.jt, self.ops, self.np, self.torch, self.cuda = jt, ops, np, torch, cuda
        self.F = torch.nn.functional if torch is not None else None
        self.rng = np.random.default_rng(0)
        self.dev = "cuda" if cuda else "cpu"

    def var(self, shape, grad=False):
        v = self.jt.array(self.rng.random(shape, dtype=self.np.float32))
        if not grad:
            v.stop_grad()
        return v

    def tt(self, shape, grad=False):
        if self.torch is None:
            return None
        return self.torch.rand(shape, device=self.dev, requires_grad=grad)

    # forward + backward as a training step meets them: the loss (the forward's output, summed) and the
    # gradient are both computed; with the gradient alone jittor may leave out a built-in's forward (the sum of a
    # broadcast needs no broadcast to differentiate), which no training step can.
    def fwd_bwd(self, f, *xs):
        jt = self.jt

        def step():
            loss = f(*xs).sum()
            return [loss] + jt.grad(loss, list(xs))
        return step

    def torch_fwd_bwd(self, f, x):
        torch = self.torch

        def step():
            loss = f(x).sum()
            (dx,) = torch.autograd.grad(loss, [x])
            return loss, dx
        return step


def pool3d_calls(kit: CallKit):
    ops, jt, F, torch = kit.ops, kit.jt, kit.F, kit.torch
    x5, x5g = kit.var((1, 1, 4, 4, 4)), kit.var((1, 1, 4, 4, 4), True)
    big = (8, 32, 32, 64, 64) if kit.cuda else (2, 8, 16, 32, 32)
    xb = kit.var(big)
    t5, t5g, tb = kit.tt((1, 1, 4, 4, 4)), kit.tt((1, 1, 4, 4, 4), True), kit.tt(big)
    return [
        ("max_pool3d k2s2 (1,1,4,4,4)", lambda: ops.max_pool3d(x5, 2, 2), lambda: jt.nn.max_pool3d(x5, 2, 2),
         torch and (lambda: F.max_pool3d(t5, 2, 2))),
        (f"max_pool3d k2s2 {big}", lambda: ops.max_pool3d(xb, 2, 2), lambda: jt.nn.max_pool3d(xb, 2, 2),
         torch and (lambda: F.max_pool3d(tb, 2, 2))),
        ("max_pool3d fwd+bwd (1,1,4,4,4)", kit.fwd_bwd(lambda x: ops.max_pool3d(x, 2, 2), x5g),
         kit.fwd_bwd(lambda x: jt.nn.max_pool3d(x, 2, 2), x5g),
         torch and kit.torch_fwd_bwd(lambda x: F.max_pool3d(x, 2, 2), t5g)),
    ]


def permute_calls(kit: CallKit):
    ops, torch = kit.ops, kit.torch
    x2, y2, x2g = kit.var((64, 64)), kit.var((64, 64)), kit.var((64, 64), True)
    t2, u2, t2g = kit.tt((64, 64)), kit.tt((64, 64)), kit.tt((64, 64), True)
    return [
        ("permute (64,64) (1,0)", lambda: ops.permute(x2, 1, 0), lambda: x2.permute(1, 0),
         torch and (lambda: t2.permute(1, 0).contiguous())),
        ("permute fwd+bwd (64,64)", kit.fwd_bwd(lambda x: ops.permute(x, 1, 0), x2g),
         kit.fwd_bwd(lambda x: x.permute(1, 0), x2g), torch and kit.torch_fwd_bwd(lambda x: x.permute(1, 0), t2g)),
        ("transpose_add (64,64)", lambda: ops.transpose_add(x2, y2), lambda: x2.transpose(0, 1) + y2,
         torch and (lambda: t2.transpose(0, 1) + u2)),
    ]


def broadcast_calls(kit: CallKit):
    ops, jt, torch = kit.ops, kit.jt, kit.torch
    xe, xeg = kit.var((5, 1, 1)), kit.var((5, 1, 1), True)
    te, teg = kit.tt((5, 1, 1)), kit.tt((5, 1, 1), True)
    # tiny expand_as forward + backward: calls of a few microseconds, jittor's per-op costs against ours
    tiny = [((3, 1), (3, 4)), ((5, 1, 1), (5, 8, 8))]
    tiny_vars = [(kit.var(xs, True), kit.var(ys), kit.tt(xs, True), kit.tt(ys)) for xs, ys in tiny]
    return [
        ("broadcast_to (5,1,1)->(5,128,128)", lambda: ops.broadcast_to(xe, (5, 128, 128)),
         lambda: jt.broadcast(xe, (5, 128, 128)), torch and (lambda: te.expand(5, 128, 128).contiguous())),
        ("broadcast_to fwd+bwd", kit.fwd_bwd(lambda x: ops.broadcast_to(x, (5, 128, 128)), xeg),
         kit.fwd_bwd(lambda x: jt.broadcast(x, (5, 128, 128)), xeg),
         torch and kit.torch_fwd_bwd(lambda x: x.expand(5, 128, 128).contiguous(), teg)),
    ] + [
        ("expand_as fwd+bwd " + f"{xs}->{ys}".replace(" ", ""), kit.fwd_bwd(lambda x, y=y: ops.expand_as(x, y), x),
         kit.fwd_bwd(lambda x, y=y: x.expand_as(y), x),
         torch and kit.torch_fwd_bwd(lambda t, u=u: t.expand_as(u).contiguous(), t))
        for (xs, ys), (x, y, t, u) in zip(tiny, tiny_vars)
    ]


def timex_naive(w, k):
    """The time-mix as jittor's own ops: out[b, c, t] = sum over u <= t of w[c, T - 1 - (t - u)] * k[b, c, u]."""
    b, ch, t = k.shape
    kk = k.reindex([b, ch, t, t], ["i0", "i1", "i2-i3"], overflow_value=0)
    return (kk * w.reindex([b, ch, t, t], ["i1", f"{t - 1}-i3"])).sum(3)


def timex_calls(kit: CallKit):
    ops, torch, F = kit.ops, kit.torch, kit.F
    w, k = kit.var((64, 64)), kit.var((1, 64, 64))
    wg, kg = kit.var((64, 64), True), kit.var((1, 64, 64), True)

    def timex_torch(w, k):
        T = k.shape[-1]
        return F.conv1d(F.pad(k, (T - 1, 0)), w.unsqueeze(1), groups=k.shape[1])

    return [
        ("timex B1 C64 T64", lambda: ops.timex(w, k), lambda: timex_naive(w, k),
         torch and (lambda: timex_torch(kit.tt((64, 64)), kit.tt((1, 64, 64))))),
        ("timex fwd+bwd B1 C64 T64", kit.fwd_bwd(ops.timex, wg, kg), kit.fwd_bwd(timex_naive, wg, kg), None),
    ]


def call_cases(jt, ops, np, torch, cuda: bool):
    """(name, ops call, jittor call, torch call or None) of every family's bench rows (``ops/registry.py``, each
    record's ``bench``), in the registry's order: each call returns what must be synced."""
    from . import registry
    kit = CallKit(jt, ops, np, torch, cuda)
    return [row for record in registry.families() if record.bench for row in record.bench_calls()(kit)]


def run_calls(args) -> int:
    import numpy as np

    import ops
    from ops._jittor import jt
    cuda = args.device == "cuda" or (args.device is None and ops.has_cuda())
    jt.flags.use_cuda = int(cuda)
    torch = None if args.no_torch else _torch()
    if torch is not None and cuda and not torch.cuda.is_available():
        torch = None

    def jt_sync(out):
        jt.sync(list(out) if isinstance(out, (list, tuple)) else [out], device_sync=True)

    def torch_sync(_):
        if cuda:
            torch.cuda.synchronize()

    print(f"wall clock per call (us), {'CUDA' if cuda else 'CPU'}, sync after each call; "
          f"{'' if torch is not None else 'PyTorch not available; '}medians of 7 interleaved rounds of {args.calls} "
          "calls; ops/jittor: the median of the rounds' ratios")
    print(f"{'call':36s} {'ops':>9s} {'jittor':>9s} {'torch':>9s} {'ops/jittor':>11s}")
    for name, ours, theirs, torch_call in call_cases(jt, ops, np, torch, cuda):
        if args.filter and args.filter not in name:
            continue
        timed = [(ours, jt_sync), (theirs, jt_sync)] + ([(torch_call, torch_sync)] if torch_call else [])
        medians, ratio = _interleaved_us(timed, args.calls)
        c = medians[2] if torch_call else float("nan")
        print(f"{name:36s} {medians[0]:9.1f} {medians[1]:9.1f} {c:9.1f} {ratio:11.2f}", flush=True)
    return 0


CNN_WIDTHS = (32, 64, 128)  # conv3d 3->32->64->128, each + ReLU + MaxPool3d(2), then a linear head
CNN_CLASSES = 10


def cnn_parameters(rng, channels: int = 3):
    """One set of float32 parameters (PyTorch's default init ranges) shared by the jittor and PyTorch models."""
    params, c_in = [], channels
    for c_out in CNN_WIDTHS:
        bound = 1 / (c_in * 27) ** 0.5
        params += [rng.uniform(-bound, bound, (c_out, c_in, 3, 3, 3)), rng.uniform(-bound, bound, c_out)]
        c_in = c_out
    bound = 1 / c_in ** 0.5
    params += [rng.uniform(-bound, bound, (CNN_CLASSES, c_in)), rng.uniform(-bound, bound, CNN_CLASSES)]
    return [p.astype("float32") for p in params]


def jittor_cnn(jt, pool, params):
    """The 3-D CNN in jittor with ``pool()`` as its pooling layer, loaded with ``params``."""
    class Cnn(jt.Module):
        def __init__(self):
            super().__init__()
            self.convs = jt.nn.ModuleList([jt.nn.Conv3d(a, b, 3, padding=1)
                                           for a, b in zip((3,) + CNN_WIDTHS[:-1], CNN_WIDTHS)])
            self.pools = jt.nn.ModuleList([pool() for _ in CNN_WIDTHS])
            self.head = jt.nn.Linear(CNN_WIDTHS[-1], CNN_CLASSES)

        def execute(self, x):
            for conv, pool in zip(self.convs, self.pools):
                x = pool(jt.nn.relu(conv(x)))
            return self.head(x.mean(dims=(2, 3, 4)))

    model = Cnn()
    targets = [t for conv in model.convs for t in (conv.weight, conv.bias)] + [model.head.weight, model.head.bias]
    for target, value in zip(targets, params):
        target.assign(jt.array(value))
    return model


def torch_cnn(torch, params, device):
    tnn = torch.nn
    layers, c_in = [], 3
    for c_out in CNN_WIDTHS:
        layers += [tnn.Conv3d(c_in, c_out, 3, padding=1), tnn.ReLU(), tnn.MaxPool3d(2)]
        c_in = c_out
    model = tnn.Sequential(*layers, tnn.AdaptiveAvgPool3d(1), tnn.Flatten(), tnn.Linear(c_in, CNN_CLASSES))
    targets = [m for m in model if isinstance(m, (tnn.Conv3d, tnn.Linear))]
    with torch.no_grad():
        for i, module in enumerate(targets):
            module.weight.copy_(torch.from_numpy(params[2 * i]))
            module.bias.copy_(torch.from_numpy(params[2 * i + 1]))
    return model.to(device)


def _cnn_batch(np, batch: int, cuda: bool, seed: int = 1):
    shape = (batch, 3, 16, 112, 112) if cuda else (batch, 3, 16, 32, 32)
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, CNN_CLASSES, batch).astype(np.int32)


LR = 0.01


def _jittor_step(jt, model, x, y):
    opt = jt.optim.SGD(model.parameters(), LR)

    def step():
        loss = jt.nn.cross_entropy_loss(model(x), y)
        opt.step(loss)
        return loss
    return step


def _first_losses(step, sync, count: int = 3):
    losses = []
    for _ in range(count):
        loss = step()
        sync(loss)
        losses.append(float(loss.item()))
    return losses


def run_model(args) -> int:
    import numpy as np

    import ops
    from ops._jittor import jt
    cuda = args.device == "cuda" or (args.device is None and ops.has_cuda())
    jt.flags.use_cuda = int(cuda)
    if args.data_parallel:
        return run_data_parallel(args, jt, np, cuda)
    torch = None if args.no_torch else _torch()
    if torch is not None and cuda and not torch.cuda.is_available():
        torch = None
    rng = np.random.default_rng(0)
    params = cnn_parameters(rng)
    x_np, y_np = _cnn_batch(np, args.batch or (8 if cuda else 2), cuda)

    B, C, T = (8, 256, 256) if cuda else (2, 32, 64)
    k_np = rng.standard_normal((B, C, T)).astype(np.float32)

    class Rwkv(jt.Module):
        def __init__(self, mix, transpose):
            super().__init__()
            self.w = jt.array(rng.uniform(0, 1, (C, T)).astype(np.float32))
            self.proj = jt.nn.Linear(C, C)
            self.mix, self.transpose = mix, transpose

        def execute(self, k):
            return self.proj(self.transpose(self.mix(self.w, k))).mean()

    def rwkv_step(model, k):
        opt = jt.optim.SGD(model.parameters(), 1e-3)

        def step():
            loss = model(k)
            opt.step(loss)
            return loss
        return step

    def jt_sync(out):
        jt.sync_all(True)

    x, y, k = jt.array(x_np), jt.array(y_np), jt.array(k_np)
    cnn_rows = [("3-D CNN, ops.MaxPool3d", _jittor_step(jt, jittor_cnn(jt, lambda: ops.MaxPool3d(2), params), x, y)),
                ("3-D CNN, jt.nn.MaxPool3d", _jittor_step(jt, jittor_cnn(jt, lambda: jt.nn.MaxPool3d(2), params), x, y))]
    # jittor's own transpose of the last axis runs on the host without cuTT: the ops model uses ops.permute
    rows = [("RWKV time-mix, ops", rwkv_step(Rwkv(ops.timex, lambda y: ops.permute(y, 0, 2, 1)), k)),
            ("RWKV time-mix, naive jittor", rwkv_step(Rwkv(timex_naive, lambda y: y.transpose(0, 2, 1)), k))]
    cnn_torch, rows_torch = [], []
    if torch is not None:
        tnn, F = torch.nn, torch.nn.functional
        dev = "cuda" if cuda else "cpu"
        tmodel = torch_cnn(torch, params, dev)
        tx, ty = torch.from_numpy(x_np).to(dev), torch.from_numpy(y_np).long().to(dev)
        tw = torch.rand((C, T), device=dev, requires_grad=True)
        tproj = tnn.Linear(C, C).to(dev)
        tk = torch.from_numpy(k_np).to(dev)

        def torch_step(params, loss_fn, lr):
            opt = torch.optim.SGD(params, lr)

            def step():
                opt.zero_grad()
                loss = loss_fn()
                loss.backward()
                opt.step()
                return loss
            return step

        def rwkv_loss():
            out = F.conv1d(F.pad(tk, (T - 1, 0)), tw.unsqueeze(1), groups=C)
            return tproj(out.transpose(1, 2)).mean()

        def torch_sync(_):
            if cuda:
                torch.cuda.synchronize()
        cnn_torch = [("3-D CNN, PyTorch", torch_step(tmodel.parameters(), lambda: F.cross_entropy(tmodel(tx), ty), LR),
                      torch_sync)]
        rows_torch = [("RWKV time-mix, PyTorch conv1d",
                       torch_step([tw] + list(tproj.parameters()), rwkv_loss, 1e-3), torch_sync)]
    cudnn = "cuDNN" if getattr(jt, "cudnn", None) is not None else "no cuDNN: jittor's own convolutions"
    print(f"ms per training step (forward, backward, SGD), {'CUDA' if cuda else 'CPU'}, jittor with {cudnn}; "
          f"3-D CNN input {x_np.shape}, time-mix B{B} C{C} T{T}")
    timed = [(name, step, jt_sync) for name, step in cnn_rows] + cnn_torch
    for name, step, sync in timed:  # the same parameters and batch: the first losses agree across the rows
        losses = _first_losses(step, sync)
        print(f"{name:34s} {_per_call_us(step, sync, args.steps) / 1e3:9.3f} ms   first losses "
              + " ".join(f"{v:.6f}" for v in losses), flush=True)
    for name, step, sync in [(n, s, jt_sync) for n, s in rows] + rows_torch:
        print(f"{name:34s} {_per_call_us(step, sync, args.steps) / 1e3:9.3f} ms", flush=True)
    return 0


def run_data_parallel(args, jt, np, cuda: bool) -> int:
    """The 3-D CNN under jittor's MPI data parallel (``mpirun -np N python -m ops.bench model --data-parallel``):
    every rank starts from rank 0's parameters and takes its slice of one global batch; jittor's optimizer
    averages the gradients (through NCCL where jittor has it). Rank 0 prints the global loss of the first
    steps (equal to one GPU's on the same batch) and samples/s."""
    import ops
    rank, size = jt.rank, jt.world_size
    batch = args.batch or 8 * size
    if batch % size:
        raise SystemExit(f"--batch {batch} must divide among {size} ranks")
    x_np, y_np = _cnn_batch(np, batch, cuda)
    share = slice(rank * batch // size, (rank + 1) * batch // size)
    model = jittor_cnn(jt, lambda: ops.MaxPool3d(2), cnn_parameters(np.random.default_rng(rank)))
    if jt.in_mpi:
        model.mpi_param_broadcast(0)  # ranks may have drawn other parameters: rank 0's win
    step = _jittor_step(jt, model, jt.array(x_np[share]), jt.array(y_np[share]))

    def global_loss(loss):
        return loss.mpi_all_reduce("mean") if jt.in_mpi else loss

    losses = []
    for _ in range(args.dp_steps):
        losses.append(float(global_loss(step()).item()))
    jt.sync_all(True)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        jt.sync_all(True)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    nccl = jt.compile_extern.nccl_ops is not None
    if rank == 0:
        print(f"data parallel, {size} rank(s){' (NCCL)' if nccl else ''}, global batch {batch} of "
              f"{x_np.shape[1:]}: {seconds * 1e3:.3f} ms a step (median; min {min(times) * 1e3:.3f}), "
              f"{batch / seconds:.1f} samples/s; losses of the "
              f"first {len(losses)} steps " + " ".join(f"{v:.7f}" for v in losses), flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ops.bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("what", choices=("calls", "model"), help="per-call table or training steps")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda where jittor has it")
    ap.add_argument("--calls", type=int, default=300, help="calls per round (calls)")
    ap.add_argument("--steps", type=int, default=20, help="steps per round (model)")
    ap.add_argument("--batch", type=int, default=None,
                    help="3-D CNN batch (global batch with --data-parallel); default 8 a GPU, 2 on the CPU")
    ap.add_argument("--data-parallel", action="store_true",
                    help="the 3-D CNN under jittor's MPI: mpirun -np N python -m ops.bench model --data-parallel")
    ap.add_argument("--dp-steps", type=int, default=5, help="steps whose global loss --data-parallel prints")
    ap.add_argument("--filter", default=None, help="only calls whose name contains this")
    ap.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    args = ap.parse_args(argv)
    return run_calls(args) if args.what == "calls" else run_model(args)


if __name__ == "__main__":
    sys.exit(main())
