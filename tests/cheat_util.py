"""What the grader tests' cheat modules share: a CPU spin on the clock as it was when this was imported (a module
may replace time.perf_counter after)."""
import time

_clock = time.perf_counter


def spin(seconds: float) -> None:
    """Keep the CPU busy for ``seconds`` of wall time."""
    end = _clock() + seconds
    while _clock() < end:
        pass


OPS_FUNCTIONS = ("permute", "max_pool3d", "broadcast_to", "transpose_add", "timex")


def wrap_ops(wrap) -> dict:
    """{name: wrap(name, ops' function)} for each function the grader's families call."""
    import ops
    return {name: wrap(name, getattr(ops, name)) for name in OPS_FUNCTIONS}


def call_key(name, args, kwargs) -> tuple:
    """A call of function ``name`` by its inputs' shapes and dtypes and its other arguments."""
    return (name, tuple((tuple(a.shape), str(a.dtype)) if hasattr(a, "shape") else a for a in args),
            tuple(sorted(kwargs.items())))
