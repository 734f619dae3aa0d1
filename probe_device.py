import time, os, sys, json
t0 = time.time()
import ops
from ops._jittor import jt
import numpy as np
print("import ops: %.1fs has_cuda=%s machine=%s" % (time.time()-t0, ops.has_cuda(), ops._jittor.MACHINE), flush=True)
print("cache", jt.flags.cache_path)
jt.flags.use_cuda = 1
# copy bandwidth with cudaMemcpyAsync, profiled
n = 1 << 28  # 1 GiB fp32
x = jt.array(np.random.rand(n).astype("float32"))
print("roundtrip ok", np.array_equal(x.numpy()[:5], x.numpy()[:5]), x.numpy()[:3])
x.sync()
def copy(x):
    return jt.code(x.shape, x.dtype, [x], cuda_src="cudaMemcpyAsync(out0_p, in0_p, in0->size, cudaMemcpyDeviceToDevice);",
                   cpu_src="memcpy(out0_p, in0_p, in0->size);")
y = copy(x); y.sync(True)
for rerun in (10, 100):
    with jt.profile_scope(2, rerun) as rep:
        copy(x).sync(True)
    print("rerun", rerun, [(r[2], r[3], r[4]) for r in rep[1:]], "GB/s", 2*4*n/float(rep[1][4]))
# small op profile
s = jt.ones((1024,), "float32"); s.sync()
with jt.profile_scope(2, 100) as rep:
    copy(s).sync(True)
print("small", [(r[2], r[3], r[4]) for r in rep[1:]])
# torch in the same process
t1 = time.time()
import torch
print("torch", torch.__version__, torch.cuda.is_available(), "import %.1fs" % (time.time()-t1))
a = torch.empty(n, device="cuda"); b = torch.empty_like(a)
st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize()
st.record()
for _ in range(20): b.copy_(a)
en.record(); torch.cuda.synchronize()
ms = st.elapsed_time(en) / 20
print("torch copy %.3f ms -> %.0f GB/s" % (ms, 2 * 4 * n / ms / 1e6))
# jittor still fine after torch
z = copy(s); print("jittor after torch ok", float(z.numpy()[0]))
# grad injection trick
class Inject(jt.Function):
    def execute(self, y, dy):
        self.dy = dy
        return y.clone()
    def grad(self, g):
        return self.dy, None
xx = jt.array(np.random.rand(4, 5).astype("float32"))
yy = (xx * xx); yy.sync()
dy = jt.array(np.random.rand(4, 5).astype("float32")); dy.sync()
with jt.profile_scope() as rep:
    g = jt.grad(Inject.apply(yy, dy).sum(), xx); g.sync(True)
print("inject ok", np.allclose(g.numpy(), 2 * xx.numpy() * dy.numpy()), [r[0][:80] for r in rep[1:]])
print(torch.cuda.get_device_properties(0))
