#!/usr/bin/env python3
"""bench/run epochs — eviction policies on a dataset twice the cache, read for 3 epochs, each a
fresh global shuffle, once per policy (lru, static, clairvoyant).

Runs build/bin/cache_bench epochs: the cache tiers (NVMe segments + RocksDB index, DRAM tier
off so the policy alone decides) driven through their C++ API over an in-process upstream, with
the recorded access order (the shuffle of all chunks, epoch after epoch) handed to the
clairvoyant policy the way the epoch planner does. Hit ratio = chunks of epochs 2-3 not fetched
from upstream ÷ chunks read in epochs 2-3.

Options: --dataset-mib N (default 1024; --quick 256), --chunk-kib N (default 1024),
--segment-kib N (default 16384; --quick 4096). The cache is half the dataset.

Figures: hit_ratio_lru, hit_ratio_static, hit_ratio_clairvoyant, upstream_bytes_<policy>."""
import json
import os
import subprocess
import sys

import _serving as S


def body(quick, argv):
    S.need("cache_bench")
    opts = {"--dataset-mib": 256 if quick else 1024, "--chunk-kib": 1024,
            "--segment-kib": 4096 if quick else 16384}
    it = iter(argv)
    for a in it:
        if a in opts:
            opts[a] = int(next(it))
        else:
            raise S.CannotMeasure(f"unknown option {a}")
    b = S.Bench("epochs")
    args = [os.path.join(S.BIN, "cache_bench"), "epochs", "--dir", b.path("caches"),
            "--dataset-mib", opts["--dataset-mib"], "--cache-mib", opts["--dataset-mib"] // 2,
            "--chunk-kib", opts["--chunk-kib"], "--segment-kib", opts["--segment-kib"]]
    print(f"dataset {opts['--dataset-mib']} MiB, cache {opts['--dataset-mib'] // 2} MiB, "
          f"chunk {opts['--chunk-kib']} KiB, segment {opts['--segment-kib']} KiB, 3 epochs of global shuffle")
    out = b.run(*args)
    lines = out.strip().splitlines()
    for line in lines[:-1]:
        print(line)
    figures = json.loads(lines[-1])
    ok = figures["hit_ratio_clairvoyant"] >= figures["hit_ratio_static"] > figures["hit_ratio_lru"]
    print(f"target hit_ratio_clairvoyant >= hit_ratio_static > hit_ratio_lru: {'met' if ok else 'MISSED'}")
    return figures


if __name__ == "__main__":
    S.main(body)
