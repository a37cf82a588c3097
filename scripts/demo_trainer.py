#!/usr/bin/env python3
"""The trainer part of `make demo`: 2 ranks of one job read EPOCHS epochs of DATASET through the
node daemon's local service (sc_trainer_bench, shared memory), and a table per epoch shows what
the node did, from its /metrics before and after:

  wall     slowest rank's wall time
  MB/s     dataset bytes delivered to both ranks ÷ wall
  hit      chunk reads answered by the cache (DRAM + NVMe) ÷ all chunk reads
  fetched  bytes fetched from the upstream (origin), as payload
  comp     payload ÷ wire bytes of those fetches (zstd per message; 1.0 = sent raw)
  stall    time the ranks waited in Next() ÷ their wall time (mean of ranks); each rank
           "computes" 2 ms per batch of 32 samples, like a small model step

The daemon prefetches along the plan, so even in the cold epoch most demand reads find their
chunk already fetched: `fetched` shows that epoch 0 went to the origin and epoch 1 did not.

  demo_trainer.py BIN_DIR SOCKET METRICS_PORT DATASET [EPOCHS] [RANKS]"""
import json
import subprocess
import sys
import urllib.request


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def delta(m1, m0, key):
    return m1.get(key, 0.0) - m0.get(key, 0.0)


def main():
    bin_dir, sock, port, dataset = sys.argv[1:5]
    epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    ranks = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    print(f"{'epoch':>5} {'wall s':>8} {'MB/s':>9} {'hit':>6} {'fetched MiB':>12} {'comp':>6} {'stall':>7}")
    for epoch in range(epochs):
        m0 = metrics(port)
        procs = [subprocess.Popen([f"{bin_dir}/sc_trainer_bench", "--socket", sock, "--dataset", dataset,
                                   "--batch-size", "32", "--shuffle", "block", "--seed", "7",
                                   "--epoch", str(epoch), "--rank", str(r), "--world-size", str(ranks),
                                   "--compute-us", "2000"],
                                  stdout=subprocess.PIPE, text=True) for r in range(ranks)]
        results = []
        for p in procs:
            out, _ = p.communicate()
            if p.returncode != 0:
                sys.exit(f"rank failed with exit code {p.returncode}")
            results.append(json.loads(out.splitlines()[-1]))
        m1 = metrics(port)
        wall = max(r["wall_s"] for r in results)
        delivered = sum(r["bytes"] for r in results)
        hits = delta(m1, m0, 'shardcache_cache_hits_total{tier="dram"}') + \
            delta(m1, m0, 'shardcache_cache_hits_total{tier="nvme"}')
        misses = delta(m1, m0, "shardcache_cache_misses_total")
        payload = delta(m1, m0, "shardcache_upstream_payload_bytes_total")
        wire = delta(m1, m0, "shardcache_upstream_wire_bytes_total")
        stall = sum(r["stall_fraction"] for r in results) / len(results)
        hit = hits / (hits + misses) if hits + misses else float("nan")
        comp = f"{payload / wire:.2f}" if wire else "-"
        print(f"{epoch:>5} {wall:>8.2f} {delivered / wall / 1e6:>9.1f} {hit:>6.2f} "
              f"{payload / 2**20:>12.1f} {comp:>6} {stall:>7.3f}")


if __name__ == "__main__":
    main()
