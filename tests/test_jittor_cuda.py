"""On a GPU machine, the bootstrap must give a jittor whose core and cuBLAS, cub, cuRAND extensions run."""
import numpy as np
import pytest

from ops import _codegen
from ops._jittor import jt

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("on_gpu")]


def test_code_op_with_snippet_header(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    src = """
    __global__ void twice(const float* a, float* b, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) b[i] = 2.f * a[i];
    }
    twice<<<ops_ceil_div(in0_shape0, 256), 256>>>(in0_p, out0_p, in0_shape0);
    OPS_CHECK_LAUNCH();
    """
    y = jt.code(x.shape, "float32", [jt.array(x)], cuda_header=_codegen.header(["common"]), cuda_src=src)
    np.testing.assert_array_equal(y.numpy(), 2 * x)


def test_cublas_matmul(rng):
    a, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
    np.testing.assert_allclose(jt.matmul(jt.array(a), jt.array(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_cub_cumsum_and_argsort(rng):
    x = rng.standard_normal(4096).astype(np.float32)
    np.testing.assert_allclose(jt.cumsum(jt.array(x), dim=0).numpy(), np.cumsum(x), rtol=1e-4, atol=1e-3)
    idx, _ = jt.argsort(jt.array(x))
    np.testing.assert_array_equal(idx.numpy(), np.argsort(x, kind="stable"))


def test_curand():
    r = jt.random((1 << 16,)).numpy()
    assert 0.0 <= r.min() and r.max() < 1.0 and abs(r.mean() - 0.5) < 0.01
