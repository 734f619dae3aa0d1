"""What a model pays per call and per training step: ``python -m ops.bench calls`` and ``python -m ops.bench model``.

``calls``: wall clock per call of each public op on small inputs, building the graph and running it with a sync
after every call (as a training loop meets it), next to jittor's nearest built-in and PyTorch eager, in one
process. ``model``: ms per training step (forward, backward, SGD update) of two small models: a 3-D CNN block
with ``ops.MaxPool3d`` against the same block with ``jt.nn.MaxPool3d`` and PyTorch's, and an RWKV-style
time-mix block with ``ops.timex`` against the naive jittor composite and PyTorch's causal ``conv1d``.

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


def call_cases(jt, ops, np, torch, cuda: bool):
    """(name, ops call, jittor call, torch call or None): each returns what must be synced."""
    rng = np.random.default_rng(0)
    dev = "cuda" if cuda else "cpu"

    def var(shape, grad=False):
        v = jt.array(rng.random(shape, dtype=np.float32))
        if not grad:
            v.stop_grad()
        return v

    def tt(shape, grad=False):
        if torch is None:
            return None
        return torch.rand(shape, device=dev, requires_grad=grad)

    # forward + backward as a training step meets them: the loss (the forward's output, summed) and the
    # gradient are both computed; with the gradient alone jittor may leave out a built-in's forward (the sum of a
    # broadcast needs no broadcast to differentiate), which no training step can.
    def fwd_bwd(f, *xs):
        def step():
            loss = f(*xs).sum()
            return [loss] + jt.grad(loss, list(xs))
        return step

    def torch_fwd_bwd(f, x):
        def step():
            loss = f(x).sum()
            (dx,) = torch.autograd.grad(loss, [x])
            return loss, dx
        return step

    x5, x5g = var((1, 1, 4, 4, 4)), var((1, 1, 4, 4, 4), True)
    big = (8, 32, 32, 64, 64) if cuda else (2, 8, 16, 32, 32)
    xb = var(big)
    x2, y2, x2g = var((64, 64)), var((64, 64)), var((64, 64), True)
    xe, xeg = var((5, 1, 1)), var((5, 1, 1), True)
    w, k = var((64, 64)), var((1, 64, 64))
    wg, kg = var((64, 64), True), var((1, 64, 64), True)
    t5, t5g, tb = tt((1, 1, 4, 4, 4)), tt((1, 1, 4, 4, 4), True), tt(big)
    t2, u2, t2g = tt((64, 64)), tt((64, 64)), tt((64, 64), True)
    te, teg = tt((5, 1, 1)), tt((5, 1, 1), True)
    F = torch.nn.functional if torch is not None else None

    def timex_naive(w, k):
        B, C, T = k.shape
        kk = k.reindex([B, C, T, T], ["i0", "i1", "i2-i3"], overflow_value=0)
        return (kk * w.reindex([B, C, T, T], ["i1", f"{T - 1}-i3"])).sum(3)

    def timex_torch(w, k):
        T = k.shape[-1]
        return F.conv1d(F.pad(k, (T - 1, 0)), w.unsqueeze(1), groups=k.shape[1])

    cases = [
        ("max_pool3d k2s2 (1,1,4,4,4)", lambda: ops.max_pool3d(x5, 2, 2), lambda: jt.nn.max_pool3d(x5, 2, 2),
         torch and (lambda: F.max_pool3d(t5, 2, 2))),
        (f"max_pool3d k2s2 {big}", lambda: ops.max_pool3d(xb, 2, 2), lambda: jt.nn.max_pool3d(xb, 2, 2),
         torch and (lambda: F.max_pool3d(tb, 2, 2))),
        ("max_pool3d fwd+bwd (1,1,4,4,4)", fwd_bwd(lambda x: ops.max_pool3d(x, 2, 2), x5g),
         fwd_bwd(lambda x: jt.nn.max_pool3d(x, 2, 2), x5g),
         torch and torch_fwd_bwd(lambda x: F.max_pool3d(x, 2, 2), t5g)),
        ("permute (64,64) (1,0)", lambda: ops.permute(x2, 1, 0), lambda: x2.permute(1, 0),
         torch and (lambda: t2.permute(1, 0).contiguous())),
        ("permute fwd+bwd (64,64)", fwd_bwd(lambda x: ops.permute(x, 1, 0), x2g),
         fwd_bwd(lambda x: x.permute(1, 0), x2g), torch and torch_fwd_bwd(lambda x: x.permute(1, 0), t2g)),
        ("transpose_add (64,64)", lambda: ops.transpose_add(x2, y2), lambda: x2.transpose(0, 1) + y2,
         torch and (lambda: t2.transpose(0, 1) + u2)),
        ("broadcast_to (5,1,1)->(5,128,128)", lambda: ops.broadcast_to(xe, (5, 128, 128)),
         lambda: jt.broadcast(xe, (5, 128, 128)), torch and (lambda: te.expand(5, 128, 128).contiguous())),
        ("broadcast_to fwd+bwd", fwd_bwd(lambda x: ops.broadcast_to(x, (5, 128, 128)), xeg),
         fwd_bwd(lambda x: jt.broadcast(x, (5, 128, 128)), xeg),
         torch and torch_fwd_bwd(lambda x: x.expand(5, 128, 128).contiguous(), teg)),
        ("timex B1 C64 T64", lambda: ops.timex(w, k), lambda: timex_naive(w, k),
         torch and (lambda: timex_torch(tt((64, 64)), tt((1, 64, 64))))),
        ("timex fwd+bwd B1 C64 T64", fwd_bwd(ops.timex, wg, kg), fwd_bwd(timex_naive, wg, kg), None),
    ]
    return cases


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


def run_model(args) -> int:
    import numpy as np

    import ops
    from ops._jittor import jt
    cuda = args.device == "cuda" or (args.device is None and ops.has_cuda())
    jt.flags.use_cuda = int(cuda)
    torch = None if args.no_torch else _torch()
    if torch is not None and cuda and not torch.cuda.is_available():
        torch = None
    rng = np.random.default_rng(0)
    n, c, d = (8, 16, 32) if cuda else (2, 4, 16)
    x_np = rng.standard_normal((n, c, d, d, d)).astype(np.float32)

    class Cnn(jt.Module):
        def __init__(self, pool):
            super().__init__()
            self.conv1 = jt.nn.Conv3d(c, 2 * c, 3, padding=1)
            self.pool = pool
            self.conv2 = jt.nn.Conv3d(2 * c, 2 * c, 3, padding=1)

        def execute(self, x):
            return self.conv2(self.pool(jt.nn.relu(self.conv1(x)))).mean()

    B, C, T = (8, 256, 256) if cuda else (2, 32, 64)
    k_np = rng.standard_normal((B, C, T)).astype(np.float32)

    class Rwkv(jt.Module):
        def __init__(self, mix):
            super().__init__()
            self.w = jt.array(rng.uniform(0, 1, (C, T)).astype(np.float32))
            self.proj = jt.nn.Linear(C, C)
            self.mix = mix

        def execute(self, k):
            y = self.mix(self.w, k)
            return self.proj(y.transpose(0, 2, 1)).mean()

    def timex_naive(w, k):
        b, ch, t = k.shape
        kk = k.reindex([b, ch, t, t], ["i0", "i1", "i2-i3"], overflow_value=0)
        return (kk * w.reindex([b, ch, t, t], ["i1", f"{t - 1}-i3"])).sum(3)

    def jt_step(model, x):
        opt = jt.optim.SGD(model.parameters(), 1e-3)

        def step():
            loss = model(x)
            opt.step(loss)
            return loss
        return step

    def jt_sync(out):
        jt.sync_all(True)

    x, k = jt.array(x_np), jt.array(k_np)
    rows = [("3-D CNN, ops.MaxPool3d", jt_step(Cnn(ops.MaxPool3d(2)), x)),
            ("3-D CNN, jt.nn.MaxPool3d", jt_step(Cnn(jt.nn.MaxPool3d(2)), x)),
            ("RWKV time-mix, ops.timex", jt_step(Rwkv(ops.timex), k)),
            ("RWKV time-mix, naive jittor", jt_step(Rwkv(timex_naive), k))]
    if torch is not None:
        tnn, F = torch.nn, torch.nn.functional
        dev = "cuda" if cuda else "cpu"
        tcnn = tnn.Sequential(tnn.Conv3d(c, 2 * c, 3, padding=1), tnn.ReLU(), tnn.MaxPool3d(2),
                              tnn.Conv3d(2 * c, 2 * c, 3, padding=1)).to(dev)
        tw = torch.rand((C, T), device=dev, requires_grad=True)
        tproj = tnn.Linear(C, C).to(dev)
        tx, tk = torch.from_numpy(x_np).to(dev), torch.from_numpy(k_np).to(dev)

        def torch_step(params, loss_fn):
            opt = torch.optim.SGD(params, 1e-3)

            def step():
                opt.zero_grad()
                loss = loss_fn()
                loss.backward()
                opt.step()
                return loss
            return step

        def rwkv_loss():
            y = F.conv1d(F.pad(tk, (T - 1, 0)), tw.unsqueeze(1), groups=C)
            return tproj(y.transpose(1, 2)).mean()

        def torch_sync(_):
            if cuda:
                torch.cuda.synchronize()
        rows_torch = [("3-D CNN, PyTorch", torch_step(tcnn.parameters(), lambda: tcnn(tx).mean())),
                      ("RWKV time-mix, PyTorch conv1d", torch_step([tw] + list(tproj.parameters()), rwkv_loss))]
    else:
        rows_torch = []
    print(f"ms per training step (forward, backward, SGD), {'CUDA' if cuda else 'CPU'}; CNN input {x_np.shape}, "
          f"time-mix B{B} C{C} T{T}")
    for name, step in rows:
        print(f"{name:34s} {_per_call_us(step, jt_sync, args.steps) / 1e3:9.3f} ms", flush=True)
    for name, step in rows_torch:
        print(f"{name:34s} {_per_call_us(step, torch_sync, args.steps) / 1e3:9.3f} ms", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ops.bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("what", choices=("calls", "model"), help="per-call table or training steps")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda where jittor has it")
    ap.add_argument("--calls", type=int, default=300, help="calls per round (calls)")
    ap.add_argument("--steps", type=int, default=20, help="steps per round (model)")
    ap.add_argument("--filter", default=None, help="only calls whose name contains this")
    ap.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    args = ap.parse_args(argv)
    return run_calls(args) if args.what == "calls" else run_model(args)


if __name__ == "__main__":
    sys.exit(main())
