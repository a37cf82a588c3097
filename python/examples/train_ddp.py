#!/usr/bin/python3
"""Training with PyTorch through the node's shardcached: DDP ranks, DataLoader workers, samples
by field, and a resumable checkpoint of model and data position together.

    python3 python/examples/train_ddp.py --nproc 2 --socket /run/shardcache/shardcached.sock \\
        --dataset images --epochs 2 --workers 2

With --nproc N it starts N ranks on this machine itself (RANK, WORLD_SIZE, MASTER_ADDR/PORT in
their environment, as torchrun sets them; Debian's torchrun 1.13 fails under Python 3.11). Under
torchrun or another launcher, leave --nproc out.

The dataset is a WebDataset tar dataset whose samples have a .jpg and a .cls member (what
`shardctl pack` makes of a train/<class>/<image>.{jpg,cls} tree). Each rank prints one line per
epoch; --stop-after N stops rank 0's job after N steps of the first epoch run (as a preempted
job would), leaving --checkpoint behind; the next run resumes from it, on any number of ranks
or workers, and reads exactly the samples the stopped run had not.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from shardcache.torch import DataLoader, IterableDataset


def features(jpg, width=256):
    """A stand-in for image decoding: the first `width` bytes of each image as floats."""
    x = torch.zeros(len(jpg), width)
    for i, v in enumerate(jpg):           # Ragged: v is a uint8 tensor view of sample i's .jpg
        n = min(width, len(v))
        x[i, :n] = v[:n].float() / 255
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", default="/run/shardcache/shardcached.sock")
    ap.add_argument("--dataset", default="images")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--checkpoint", default="")
    ap.add_argument("--stop-after", type=int, default=0, help="stop after this many steps (0 = never)")
    ap.add_argument("--nproc", type=int, default=0, help="start this many ranks here (default: launched by torchrun)")
    args = ap.parse_args()
    if args.nproc and "RANK" not in os.environ:
        sys.exit(launch(args.nproc))

    dist.init_process_group("gloo")                     # torchrun sets RANK, WORLD_SIZE, MASTER_*
    rank = dist.get_rank()
    # rank and world_size come from torch.distributed. decode: .cls text -> int tensor.
    ds = IterableDataset(args.socket, args.dataset, batch_size=args.batch_size, seed=17, shuffle="block",
                         drop_last=False, decode={"cls": lambda b: int(bytes(b))})
    loader = DataLoader(ds, num_workers=args.workers, persistent_workers=args.workers > 0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, args.classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    first_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint)
        model.module.load_state_dict(ckpt["model"])
        loader.load_state_dict(ckpt["data"])            # any rank's state; any world size or workers
        first_epoch = ckpt["data"]["epoch"]
        if rank == 0:
            print(f"resuming epoch {first_epoch} at global position {ckpt['data']['position']}", flush=True)

    steps = 0
    for epoch in range(first_epoch, args.epochs):
        if epoch != first_epoch:
            ds.set_epoch(epoch)                         # optional: a new iteration advances by itself
        t0, samples, loss_sum, n = time.perf_counter(), 0, 0.0, 0
        for batch in loader:
            x = features(batch["jpg"])
            y = batch["cls"] % args.classes
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()                             # a collective: every rank runs the same steps
            opt.step()
            samples += len(y)
            loss_sum, n = loss_sum + float(loss), n + 1
            steps += 1
            if args.stop_after and steps == args.stop_after:
                if rank == 0 and args.checkpoint:
                    torch.save({"model": model.module.state_dict(), "data": loader.state_dict()}, args.checkpoint)
                print(f"rank {rank}: stopped after {steps} steps of epoch {epoch}", flush=True)
                dist.destroy_process_group()
                return
        wall = time.perf_counter() - t0
        print(f"rank {rank} epoch {epoch}: {n} steps, {samples} samples, {samples / wall:,.0f} samples/s, "
              f"loss {loss_sum / max(1, n):.3f}", flush=True)
    dist.destroy_process_group()


def launch(nproc):
    """Starts nproc ranks of this script, as torchrun would; returns the first failing exit code."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    main()
