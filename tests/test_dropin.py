"""The layers and functions as drop-ins: the argument orders, keywords and forms of jittor's, PyTorch's and
NumPy's own (positional layer arguments, NumPy integers, ranges and arrays of dims, jittor's None defaults,
numbers as NumPy scalars or one-element Vars), empty inputs, layer reprs and help texts, errors naming the
argument at construction."""
import pydoc

import numpy as np
import pytest

import ops
from ops import permutation as P
from ops import time_mix as X
from ops._jittor import jt
from ops.scoring.fam_pool3d import reference_grad, reference_pool



def grads(out, *inputs):
    """d(sum(out * dy))/d(inputs) for a fixed dy of ones times 0.5."""
    return jt.grad((out * 0.5).sum(), list(inputs))


# ---- MaxPool3d --------------------------------------------------------------------------------------------

def test_maxpool3d_positional_arguments_take_the_layers_order(rng):
    """torch.nn.MaxPool3d and jittor.nn.MaxPool3d: (kernel_size, stride, padding, dilation, return_indices,
    ceil_mode). The fifth positional argument asks for the indices, the sixth for ceil_mode."""
    x = rng.standard_normal((2, 3, 7, 7, 7)).astype(np.float32)
    want, want_idx = reference_pool(x, 2, 2, 0, 1, ceil_mode=False)
    values, idx = ops.MaxPool3d(2, 2, 0, 1, True)(jt.array(x))
    np.testing.assert_array_equal(values.numpy(), want)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    want_ceil, _ = reference_pool(x, 2, 2, 0, 1, ceil_mode=True)
    out = ops.MaxPool3d(2, 2, 0, 1, False, True)(jt.array(x))
    assert tuple(out.shape) == (2, 3, 4, 4, 4)
    np.testing.assert_array_equal(out.numpy(), want_ceil)


def test_maxpool3d_keywords_and_attributes_as_pytorch(rng):
    x = rng.standard_normal((1, 2, 9, 8, 7)).astype(np.float32)
    layer = ops.MaxPool3d(kernel_size=3, stride=2, padding=1, dilation=1, return_indices=False, ceil_mode=True)
    np.testing.assert_array_equal(layer(jt.array(x)).numpy(), reference_pool(x, 3, 2, 1, 1, ceil_mode=True)[0])
    assert (layer.kernel_size, layer.stride, layer.padding, layer.dilation) == (3, 2, 1, 1)
    assert layer.ceil_mode is True and layer.return_indices is False
    default = ops.MaxPool3d(2)
    assert default.stride == 2 and default.dilation == 1 and default.ceil_mode is False
    assert repr(default) == "MaxPool3d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)"
    assert repr(ops.MaxPool3d((1, 2, 2), return_indices=True)) == (
        "MaxPool3d(kernel_size=(1, 2, 2), stride=(1, 2, 2), padding=0, dilation=1, ceil_mode=False, "
        "return_indices=True)")
    assert layer.forward(jt.array(x)).shape == layer(jt.array(x)).shape


def test_maxpool3d_takes_jittors_none_defaults_and_numpy_integers(rng):
    x = rng.standard_normal((2, 4, 6, 6, 6)).astype(np.float32)
    want = reference_pool(x, 2)[0]
    for layer in (ops.MaxPool3d(2, None, 0, None, None, False), ops.MaxPool3d(np.int64(2)),
                  ops.MaxPool3d([2, 2, 2], stride=np.array([2, 2, 2]), padding=(np.int32(0),)),
                  ops.MaxPool3d(2, stride=(), dilation=np.int64(1), ceil_mode=np.bool_(False))):
        got = layer(jt.array(x))
        assert isinstance(got, jt.Var), layer
        np.testing.assert_array_equal(got.numpy(), want)
    assert ops.MaxPool3d(np.int64(2), np.int64(1)).kernel_size == 2 and type(ops.MaxPool3d(np.int64(2)).stride) is int
    assert ops.MaxPool3d([2, 3, 3]).kernel_size == (2, 3, 3)
    got = ops.max_pool3d(jt.array(x), np.int64(2), None, 0, None, np.bool_(False), None)
    np.testing.assert_array_equal(got.numpy(), want)


def test_maxpool3d_functional_keeps_pytorchs_order(rng):
    """F.max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)."""
    x = rng.standard_normal((1, 1, 5, 5, 5)).astype(np.float32)
    out = ops.max_pool3d(jt.array(x), 2, 2, 0, 1, True)
    assert isinstance(out, jt.Var) and tuple(out.shape) == (1, 1, 3, 3, 3)
    values, idx = ops.max_pool3d(jt.array(x), 2, 2, 0, 1, False, True)
    assert tuple(values.shape) == (1, 1, 2, 2, 2) and str(idx.dtype) == "int32"


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(kernel_size=0), ValueError, "kernel_size"), (dict(kernel_size=2.5), TypeError, "kernel_size"),
    (dict(kernel_size=(2, 2)), ValueError, "kernel_size"), (dict(kernel_size="2"), TypeError, "kernel_size"),
    (dict(kernel_size=2, stride=(1, 2)), ValueError, "stride"), (dict(kernel_size=2, stride=0), ValueError, "stride"),
    (dict(kernel_size=2, padding=2), ValueError, "padding"), (dict(kernel_size=2, dilation=0), ValueError, "dilation"),
    (dict(kernel_size=2, ceil_mode="yes"), TypeError, "ceil_mode"),
    (dict(kernel_size=2, return_indices="yes"), TypeError, "return_indices"),
    (dict(kernel_size=True), TypeError, "kernel_size"),
])
def test_maxpool3d_checks_its_arguments_at_construction(kwargs, error, name):
    with pytest.raises(error, match=name):
        ops.MaxPool3d(**kwargs)


def test_maxpool3d_functional_names_a_bad_return_indices():
    with pytest.raises(TypeError, match="return_indices"):
        ops.max_pool3d(jt.ones((1, 1, 4, 4, 4)), 2, return_indices="yes")


@pytest.mark.parametrize("shape", [(0, 3, 4, 4, 4), (2, 0, 4, 4, 4), (0, 4, 4, 4)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_maxpool3d_of_an_empty_batch(shape, dtype):
    x = jt.ones(shape, dtype)
    values, idx = ops.MaxPool3d(2, return_indices=True)(x)
    assert tuple(values.shape) == shape[:-3] + (2, 2, 2) and str(values.dtype) == dtype
    assert tuple(idx.shape) == tuple(values.shape) and str(idx.dtype) == "int32"
    (dx,) = grads(ops.MaxPool3d(2)(x), x)
    assert tuple(dx.shape) == shape and str(dx.dtype) == dtype


def test_maxpool3d_gradient_through_the_layer(rng):
    x = rng.standard_normal((1, 2, 6, 6, 6)).astype(np.float32)
    xv = jt.array(x)
    (dx,) = grads(ops.MaxPool3d(3, 2, 1)(xv), xv)
    _, arg = reference_pool(x, 3, 2, 1)
    np.testing.assert_array_equal(dx.numpy(), reference_grad(x.shape, arg, np.full(arg.shape, 0.5)))


# ---- permute / transpose ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dims, perm", [
    ((range(3),), (0, 1, 2)), ((np.array([2, 0, 1]),), (2, 0, 1)), (([np.int64(2), 0, 1],), (2, 0, 1)),
    ((np.int64(2), np.int32(0), 1), (2, 0, 1)), (((-1, 0, -2),), (2, 0, 1)), ((), (2, 1, 0)), ((None,), (2, 1, 0)),
    ((jt.NanoVector([1, 2, 0]),), (1, 2, 0)), ((np.array([1, 0, 2], dtype=np.uint8),), (1, 0, 2)),
    ((range(2, -1, -1),), (2, 1, 0)),
])
def test_permute_takes_dims_as_numpy_pytorch_and_jittor_do(dims, perm, rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    want = np.transpose(x, perm)
    got = ops.permute(jt.array(x), *dims)
    assert tuple(got.shape) == want.shape
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(ops.Permute(*dims)(jt.array(x)).numpy(), want)


def test_permute_with_array_dims_reuses_its_plan(rng):
    """An array of dims is looked up by its values: the second call plans nothing (and equals the tuple's)."""
    x = jt.array(rng.standard_normal((3, 5, 7)).astype(np.float32))
    ops.permute(x, np.array([1, 2, 0])).sync()
    builds = P._PERMUTE_PLANS.builds
    for dims in (np.array([1, 2, 0]), (1, 2, 0), [1, 2, 0]):
        ops.permute(x, dims).sync()
    assert P._PERMUTE_PLANS.builds == builds


def test_transpose_takes_two_dims_one_sequence_or_none(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    xv = jt.array(x)
    np.testing.assert_array_equal(ops.transpose(xv, 0, 2).numpy(), np.swapaxes(x, 0, 2))
    np.testing.assert_array_equal(ops.transpose(xv, dim0=-1, dim1=np.int64(0)).numpy(), np.swapaxes(x, 2, 0))
    np.testing.assert_array_equal(ops.transpose(xv).numpy(), np.transpose(x))
    np.testing.assert_array_equal(ops.transpose(xv, (2, 0, 1)).numpy(), np.transpose(x, (2, 0, 1)))
    np.testing.assert_array_equal(ops.transpose(xv, np.array([1, 2, 0])).numpy(), np.transpose(x, (1, 2, 0)))
    with pytest.raises(TypeError, match="dim1"):
        ops.transpose(xv, 0)


def test_permute_layer_checks_its_dims_at_construction():
    with pytest.raises(ValueError, match="dims"):
        ops.Permute(0, 0)
    with pytest.raises(ValueError, match="dims"):
        ops.Permute((0, -2))  # -2 is dim 0 of the 2 dims listed: twice
    with pytest.raises(ValueError, match="dims"):
        ops.Permute(0, 3, 1)
    with pytest.raises(TypeError, match=r"dims\[1\]"):
        ops.Permute(0, 1.0)
    with pytest.raises(TypeError, match="dims"):
        ops.Permute(0, 1, dims=(1, 0))
    layer = ops.Permute(dims=np.array([2, 0, 1]))
    assert layer.dims == (2, 0, 1) and all(type(d) is int for d in layer.dims)
    assert repr(layer) == "Permute(dims=(2, 0, 1))"
    assert repr(ops.TransposeAdd(np.int64(1), 2)) == "TransposeAdd(dim0=1, dim1=2)"
    with pytest.raises(ValueError, match="dims"):  # a layer of 3 dims on a 2-D input
        layer(jt.ones((2, 3)))


@pytest.mark.parametrize("dtype", ["float32", "int8", "bool"])
def test_permute_transpose_and_transpose_add_of_empty_tensors(dtype):
    x = jt.zeros((0, 3, 2), dtype)
    out = ops.permute(x, range(2, -1, -1))
    assert tuple(out.shape) == (2, 3, 0) and str(out.dtype) == dtype
    out = ops.transpose(x, 0, 1)
    assert tuple(out.shape) == (3, 0, 2) and str(out.dtype) == dtype
    out = ops.transpose_add(x, jt.zeros((3, 0, 2), dtype))
    assert tuple(out.shape) == (3, 0, 2) and str(out.dtype) == dtype


def test_gradients_of_empty_permutes():
    x, y = jt.zeros((0, 3)), jt.zeros((3, 0))
    dx, = grads(ops.permute(x, np.array([1, 0])), x)
    assert tuple(dx.shape) == (0, 3) and str(dx.dtype) == "float32"
    dx, dy = grads(ops.transpose_add(x, y), x, y)
    assert (tuple(dx.shape), tuple(dy.shape)) == ((0, 3), (3, 0))


# ---- expand_as / broadcast_to -----------------------------------------------------------------------------

@pytest.mark.parametrize("x_shape, shape, want", [
    ((2, 1), np.array([4, 2, 3]), (4, 2, 3)), ((1,), range(4, 5), (4,)), ((2, 1), (np.int64(4), 2, -1), (4, 2, 1)),
    ((2, 1), [4, -1, 3], (4, 2, 3)), ((2, 1), jt.NanoVector([4, 2, 3]), (4, 2, 3)), ((1,), np.int64(5), (5,)),
])
def test_broadcast_to_takes_shapes_as_numpy_pytorch_and_jittor_do(x_shape, shape, want, rng):
    x = rng.standard_normal(x_shape).astype(np.float32)
    got = ops.broadcast_to(jt.array(x), shape)
    np.testing.assert_array_equal(got.numpy(), np.broadcast_to(x, want))


@pytest.mark.parametrize("x_shape, out_shape", [((1, 3), (0, 3)), ((0, 3), (2, 0, 3)), ((0,), (5, 0))])
def test_broadcasts_of_empty_shapes(x_shape, out_shape):
    x = jt.zeros(x_shape)
    out = ops.broadcast_to(x, out_shape)
    assert tuple(out.shape) == out_shape and str(out.dtype) == "float32"
    out = ops.expand_as(x, jt.zeros(out_shape))
    assert tuple(out.shape) == out_shape
    dx, = grads(ops.ExpandAs()(x, jt.zeros(out_shape)), x)
    assert tuple(dx.shape) == x_shape
    np.testing.assert_array_equal(dx.numpy(), np.zeros(x_shape))  # no element of x reaches the output
    assert repr(ops.ExpandAs()) == "ExpandAs()"


# ---- timex ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [np.float32(0.25), np.float64(0.25), np.array(0.25), jt.array(0.25),
                                 jt.array([0.25]), np.array([0.25], dtype=np.float16), 1, np.int64(1)])
def test_timex_takes_eps_as_a_number_in_any_form(eps, rng):
    w = jt.array(rng.standard_normal((3, 8)).astype(np.float32))
    k = jt.array(rng.standard_normal((2, 3, 8)).astype(np.float32))
    value = float(eps.item()) if hasattr(eps, "item") else float(eps)
    want = ops.timex(w, k, value).numpy()
    np.testing.assert_array_equal(ops.timex(w, k, eps).numpy(), want)
    np.testing.assert_array_equal(ops.TimeX(eps)(w, k).numpy(), want)
    layer = ops.TimeX(eps=eps)
    assert type(layer.eps) is float and layer.eps == value and repr(layer) == f"TimeX(eps={value})"


def test_timex_with_a_var_eps_plans_once(rng):
    w = jt.array(rng.standard_normal((3, 8)).astype(np.float32))
    k = jt.array(rng.standard_normal((2, 3, 8)).astype(np.float32))
    ops.timex(w, k, jt.array(0.5)).sync()
    builds = X._PLANS.builds
    for _ in range(3):
        ops.timex(w, k, jt.array(0.5)).sync()
    assert X._PLANS.builds == builds


@pytest.mark.parametrize("eps, error", [
    (jt.array([0.1, 0.2]), TypeError), (np.array([1.0, 2.0]), TypeError), ("0.1", TypeError),
    (np.bool_(True), TypeError), (np.float32("inf"), ValueError), (jt.array([True]), TypeError), (None, TypeError),
])
def test_timex_names_a_bad_eps(eps, error):
    w, k = jt.ones((3, 8)), jt.ones((2, 3, 8))
    with pytest.raises(error, match="eps"):
        ops.timex(w, k, eps)
    with pytest.raises(error, match="eps"):
        ops.TimeX(eps)


@pytest.mark.parametrize("B, C, T", [(0, 3, 8), (2, 0, 8), (2, 3, 0), (0, 0, 0)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_timex_of_empty_inputs(B, C, T, dtype):
    w, k = jt.ones((C, T), dtype), jt.ones((B, C, T), dtype)
    out = ops.timex(w, k, 0.5)
    assert tuple(out.shape) == (B, C, T) and str(out.dtype) == dtype
    gw, gk = grads(ops.TimeX(0.5)(w, k), w, k)
    assert (tuple(gw.shape), tuple(gk.shape)) == ((C, T), (B, C, T))
    assert str(gw.dtype) == dtype and str(gk.dtype) == dtype
    np.testing.assert_array_equal(gw.float32().numpy(), np.zeros((C, T)))  # an empty batch reaches no weight


# ---- help texts -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layer", [ops.MaxPool3d, ops.Permute, ops.TransposeAdd, ops.ExpandAs, ops.TimeX])
def test_help_of_each_layer_documents_its_call(layer):
    text = pydoc.render_doc(layer, renderer=pydoc.plaintext)
    own = text.split("Methods inherited from")[0]
    assert "NotImplementedError" not in own
    assert layer.execute.__doc__ and "NotImplementedError" not in layer.execute.__doc__
    assert layer.__doc__ and layer.execute is layer.forward
