"""What the link between two "hosts" of bench/gpu/hosts.sh carries: NCCL send/recv of 256 MB
from rank 0 to rank 1, each rank in its network namespace, under the NCCL settings of the
environment (sockets only there). Prints the best of three transfers in GB/s.

  python3 bench/gpu/link_probe.py NS0,NS1 ADDRESS_OF_NS0
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, namespaces, master):
    with open("/run/netns/" + namespaces[rank]) as ns:
        os.setns(ns.fileno(), os.CLONE_NEWNET)
    os.environ.update(MASTER_ADDR=master, MASTER_PORT="29517")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    x = torch.ones(64 << 20, device="cuda")  # 256 MB of float32
    best = float("inf")
    for _ in range(4):  # the first sets up the connection
        torch.cuda.synchronize()
        t = time.perf_counter()
        if rank == 0:
            dist.send(x, 1)
        else:
            dist.recv(x, 0)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    if rank == 1:
        print("%.2f GB/s (256 MB in %.1f ms)" % (x.numel() * 4 / best / 1e9, best * 1000), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.start_processes(worker, args=(sys.argv[1].split(","), sys.argv[2]), nprocs=2, start_method="spawn")
