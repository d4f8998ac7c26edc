#!/usr/bin/env python3
"""PyTorch's NCCL send/recv between two GPUs, measured as transport_bench measures Conveyor's links.

Two processes (torch.multiprocessing, one GPU each, NCCL through torch.distributed), rank 0 sends,
rank 1 receives, and for each size:

  latency   rounds of one frame: from just before rank 0's send to rank 1 having the bytes on its
            device (its recv, then a synchronize), both on CLOCK_MONOTONIC (one host); the ranks
            meet at a barrier between rounds. Median over rounds.
  GB/s      rounds of frames sent back to back (isend / irecv), as many as transport_bench sends
            (512 MiB a round, 2 to 32 frames); a round ends when rank 1 has the last on its device:
            frames x size / time, median over rounds.

The frames are float32 tensors allocated once per size; the first round of each is a warm-up.
Prints a table and, with --csv, the same rows as transport_bench's CSV (transport `torch-nccl`).

usage: bench/transport/torch_sendrecv.py [--sizes 1M,64M] [--rounds 5] [--gpus 0,1] [--csv F]
"""
import argparse
import os
import socket
import statistics
import sys
import time


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * mult[text[-1]]) if text[-1] in mult else int(text)


def worker(rank, args, port, out_path):
    import torch
    import torch.distributed as dist
    dev = torch.device("cuda", args.gpus[rank])
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=2,
                            device_id=dev)
    rows = []
    for size in args.sizes:
        t = torch.zeros(size // 4, dtype=torch.float32, device=dev)
        lat, bw = [], []
        frames = min(32, max(2, (512 << 20) // size))  # transport_bench's
        for r in range(args.rounds + 1):  # one frame
            dist.barrier()
            torch.cuda.synchronize(dev)
            stamp = torch.zeros(1, dtype=torch.float64)
            if rank == 0:
                stamp[0] = time.clock_gettime(time.CLOCK_MONOTONIC)
                dist.send(t, 1)
            else:
                dist.recv(t, 0)
                torch.cuda.synchronize(dev)
                stamp[0] = time.clock_gettime(time.CLOCK_MONOTONIC)
            g = torch.tensor([stamp.item()], device=dev, dtype=torch.float64)
            gathered = [torch.zeros(1, device=dev, dtype=torch.float64) for _ in range(2)]
            dist.all_gather(gathered, g)
            if r > 0:
                lat.append(gathered[1].item() - gathered[0].item())
        for r in range(args.rounds + 1):  # frames back to back
            dist.barrier()
            torch.cuda.synchronize(dev)
            t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
            if rank == 0:
                works = [dist.isend(t, 1) for _ in range(frames)]
            else:
                works = [dist.irecv(t, 0) for _ in range(frames)]
            for w in works:
                w.wait()
            torch.cuda.synchronize(dev)
            stamp = torch.tensor([t0, time.clock_gettime(time.CLOCK_MONOTONIC)], device=dev, dtype=torch.float64)
            gathered = [torch.zeros(2, device=dev, dtype=torch.float64) for _ in range(2)]
            dist.all_gather(gathered, stamp)
            if r > 0:  # from the sender's start to the receiver's end
                bw.append(frames * size / (gathered[1][1].item() - gathered[0][0].item()) / 1e9)
        rows.append({"size": size, "latency_us": 1e6 * statistics.median(lat), "gbps": statistics.median(bw)})
    if rank == 0:
        with open(out_path, "w") as f:
            for r in rows:
                f.write("%d,%.3f,%.3f\n" % (r["size"], r["latency_us"], r["gbps"]))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1M,64M")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--gpus", default="0,1")
    p.add_argument("--csv", default=None)
    args = p.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    args.gpus = [int(g) for g in args.gpus.split(",")]
    import tempfile
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.csv")
        mp.start_processes(worker, args=(args, free_port(), out), nprocs=2, start_method="spawn")
        rows = [line.strip().split(",") for line in open(out)]
    print("| transport | size | one frame (us) | GB/s |")
    print("| --- | ---: | ---: | ---: |")
    for size, lat, gbps in rows:
        print("| torch-nccl | %s | %s | %s |" % (size, lat, gbps))
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("transport,bytes,latency_us,gbps\n")
            for size, lat, gbps in rows:
                f.write("torch-nccl,%s,%s,%s\n" % (size, lat, gbps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
