"""On a GPU machine with a cuDNN 9: jittor's convolutions run on cuDNN, right, and its RNN layers still train."""
import numpy as np
import pytest

from ops import _jittor as boot
from ops._jittor import jt

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("on_gpu")]

needs_cudnn = pytest.mark.skipif(boot.LIBS.cudnn is None, reason="no cuDNN 9 on this machine")


def _torch():
    return pytest.importorskip("torch")


def tf32_bound(value_abs):
    """cuDNN may round a float32 convolution's inputs to TF32 (10 explicit mantissa bits) on Hopper: each product
    errs by at most 2 * 2**-11 of |x| |w|, and the float32 sum adds its own rounding; the bound is taken on the
    convolution of the absolute values, computed in float64."""
    return (2 * 2.0 ** -11 + 2.0 ** -20) * value_abs + 1e-30


def torch_reference(conv, x, w, g, *args):
    """``conv`` (torch.nn.functional's) in float64 on NumPy ``x`` and ``w`` with output gradient ``g``: ((y, gx,
    gw), the same on |x|, |w| and |g|: each error bound's scale), as NumPy arrays."""
    torch = _torch()

    def run(a, b, c):
        ta, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (a, b))
        ty = conv(ta, tb, None, *args)
        grads = torch.autograd.grad((ty * torch.from_numpy(c).double()).sum(), [ta, tb])
        return [t.detach().numpy() for t in (ty, *grads)]
    return run(x, w, g), run(np.abs(x), np.abs(w), np.abs(g))


@needs_cudnn
def test_cudnn_is_loaded_with_its_convolutions_and_without_rnn():
    assert boot.CUDNN_LOADED and jt.cudnn is not None and jt.compile_extern.cudnn is jt.cudnn
    for name in ("cudnn_conv", "cudnn_conv_backward_x", "cudnn_conv_backward_w", "cudnn_conv3d",
                 "cudnn_conv3d_backward_x", "cudnn_conv3d_backward_w"):
        assert hasattr(jt.cudnn.ops, name)
    assert not hasattr(jt.cudnn.ops, "cudnn_rnn")


@needs_cudnn
@pytest.mark.parametrize("stride, padding, dilation, groups", [(1, 1, 1, 1), (2, 0, 1, 1), (1, 2, 2, 2)])
def test_conv3d_forward_and_gradients_match_torch(rng, stride, padding, dilation, groups):
    torch = _torch()
    F = torch.nn.functional
    x = rng.standard_normal((2, 4, 7, 9, 10)).astype(np.float32)
    w = rng.standard_normal((6, 4 // groups, 3, 3, 3)).astype(np.float32)
    jx, jw = jt.array(x), jt.array(w)
    y = jt.nn.conv3d(jx, jw, None, stride, padding, dilation, groups)
    g = rng.standard_normal(y.shape).astype(np.float32)
    gx, gw = jt.grad((y * jt.array(g)).sum(), [jx, jw])

    wants, scales = torch_reference(F.conv3d, x, w, g, stride, padding, dilation, groups)
    for got, want, scale in zip((y, gx, gw), wants, scales):
        err = np.abs(got.numpy().astype(np.float64) - want)
        assert np.all(err <= tf32_bound(scale)), err.max()


@needs_cudnn
def test_conv2d_and_grouped_conv_run_on_cudnn(rng):
    """jittor relays these to cuDNN (its conv tuner); a depthwise Conv2d is its own code op, cuDNN or not."""
    x = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
    for groups in (1, 2):
        conv = jt.nn.Conv2d(8, 8, 3, padding=1, groups=groups, bias=False)
        jx = jt.array(x)
        with jt.profile_scope() as report:
            y = conv(jx).numpy()
        assert any("cudnn_conv" in str(row[0]) for row in report[1:]), [row[0] for row in report[1:]]
        w = conv.weight.numpy().astype(np.float64)
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        cin = 8 // groups
        want = np.zeros(y.shape)
        abs_want = np.zeros(y.shape)
        for o in range(8):
            first = (o // (8 // groups)) * cin
            for i in range(3):
                for j in range(3):
                    patch = xp[:, first:first + cin, i:i + 12, j:j + 12]
                    want[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j])
                    abs_want[:, o] += np.einsum("nchw,c->nhw", np.abs(patch), np.abs(w[o, :, i, j]))
        assert np.all(np.abs(y - want) <= tf32_bound(abs_want))


@needs_cudnn
@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_rnn_layers_train_a_step_on_the_gpu(rng, mode):
    layer = getattr(jt.nn, mode)(8, 16, num_layers=2)
    x = jt.array(rng.standard_normal((5, 3, 8)).astype(np.float32))
    before = [p.numpy().copy() for p in layer.parameters()]
    out, _ = layer(x)
    loss = (out * out).mean()
    jt.optim.SGD(layer.parameters(), 0.1).step(loss)
    assert out.shape == (5, 3, 16) and np.isfinite(loss.item())
    assert any(not np.array_equal(b, p.numpy()) for b, p in zip(before, layer.parameters()))
    jt.flags.use_cuda = 0  # the same layer (updated) on the CPU gives the same output
    on_cpu = layer(x)[0].numpy()
    jt.flags.use_cuda = 1
    np.testing.assert_allclose(layer(x)[0].numpy(), on_cpu, rtol=1e-4, atol=1e-5)


@needs_cudnn
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("dims, groups", [(2, 4), (2, 1), (3, 2)])
def test_half_and_bfloat16_convolutions_run_on_cudnn(rng, dtype, dims, groups):
    """cuDNN runs bfloat16 data only with float compute (and half compute on few engines): jittor's descriptor
    asks for the data's type, so the bootstrap's copies of its convolution ops ask for float. The forward and
    both gradients against float64 on the same rounded inputs: each product is exact in float; the float sums
    of up to 108 terms err by less than 2^-14 of the sum of the absolute products, besides the output's rounding."""
    torch = _torch()
    F = torch.nn.functional
    conv_t = F.conv2d if dims == 2 else F.conv3d
    conv_j = jt.nn.conv2d if dims == 2 else jt.nn.conv3d
    spatial = (1, 33) if dims == 2 else (5, 6, 7)
    kernel = (1, 9) if dims == 2 else (3, 3, 3)
    x = rng.standard_normal((2, 4) + spatial).astype(np.float32)
    w = rng.standard_normal((4, 4 // groups) + kernel).astype(np.float32)
    jx, jw = jt.array(x).astype(dtype), jt.array(w).astype(dtype)
    with jt.profile_scope() as report:
        y = conv_j(jx, jw, None, 1, 0, 1, groups)
        g = jt.array(rng.standard_normal(y.shape).astype(np.float32)).astype(dtype)
        gx, gw = jt.grad((y * g).sum(), [jx, jw])
        jt.sync([y, gx, gw])
    assert any("cudnn_conv" in str(row[0]) for row in report[1:]), [row[0] for row in report[1:]]
    wants, scales = torch_reference(conv_t, *(v.float32().numpy() for v in (jx, jw, g)), 1, 0, 1, groups)
    eps = 2.0 ** -11 if dtype == "float16" else 2.0 ** -8  # the output's rounding
    for got, want, scale in zip((y, gx, gw), wants, scales):
        assert got.dtype == dtype
        err = np.abs(got.float32().numpy().astype(np.float64) - want)
        assert np.all(err <= eps * np.abs(want) + 2.0 ** -14 * scale + 1e-30), err.max()


@needs_cudnn
def test_one_convolution_in_each_dtype_after_another(rng):
    """jittor remembers the algorithm cuDNN found for a convolution by its sizes; the bootstrap's copies of its
    ops key it by the data types too, so an algorithm found for float32 data is not run on bfloat16 or half data
    of the same sizes. Forward and both gradients of each against float64 on the same rounded inputs."""
    torch = _torch()
    x = rng.standard_normal((2, 4, 9, 33)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    for dtype in ("float32", "bfloat16", "float16", "float32"):
        jx, jw = jt.array(x).astype(dtype), jt.array(w).astype(dtype)
        y = jt.nn.conv2d(jx, jw, None, 1, 1)
        g = jt.array(rng.standard_normal(y.shape).astype(np.float32)).astype(dtype)
        gx, gw = jt.grad((y * g).sum(), [jx, jw])
        jt.sync([y, gx, gw])
        wants, scales = torch_reference(torch.nn.functional.conv2d, *(v.float32().numpy() for v in (jx, jw, g)),
                                        1, 1)
        for got, want, scale in zip((y, gx, gw), wants, scales):
            err = np.abs(got.float32().numpy().astype(np.float64) - want)
            if dtype == "float32":
                bound = tf32_bound(scale)
            else:  # float sums (error under 2^-14 of the absolute sum), then the output's rounding
                bound = (2.0 ** -11 if dtype == "float16" else 2.0 ** -8) * np.abs(want) + 2.0 ** -14 * scale
            assert np.all(err <= bound + 1e-30), (dtype, err.max())
