"""W1's arithmetic in PyTorch on one GPU: memory format, cuDNN autotuning and
micro-batch size (what two pipeline stages would each see). Prints one line per
case: the median of 15 training steps after 5 warm-up ones.

usage: python3 bench/w1_arithmetic.py   (from the repository root, on a GPU machine)
"""
import sys, time, statistics
sys.path.insert(0, "bench")
import torch, torch.nn.functional as F
import torch_pipelining as tp
dev = "cuda:0"
def bench(batch, fmt, benchmark):
    torch.backends.cudnn.benchmark = benchmark
    torch.manual_seed(0)
    m = tp.resnet50().to(dev).to(memory_format=fmt)
    opt = torch.optim.SGD(m.parameters(), lr=0.001)
    x = torch.randn(batch, 3, 128, 128, device=dev).contiguous(memory_format=fmt)
    y = F.one_hot(torch.randint(1000, (batch,), device=dev), 1000).float()
    def step():
        opt.zero_grad(set_to_none=False)
        F.mse_loss(m(x), y).backward()
        opt.step()
    for _ in range(5): step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(15):
        t = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    return 1000 * statistics.median(ts)
for batch in (120, 60, 30):
    for fmt, name in ((torch.contiguous_format, "nchw"), (torch.channels_last, "nhwc")):
        for b in (False, True):
            print("batch %3d %s benchmark=%d: %.2f ms" % (batch, name, b, bench(batch, fmt, b)), flush=True)
