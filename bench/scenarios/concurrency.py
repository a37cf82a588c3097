#!/usr/bin/env python3
"""bench/run concurrency — 8 trainer processes (8 ranks of one job, `global` shuffle) on one
node reading one cold epoch through one node shardcached, which fetches from an origin
shardcached over gRPC on loopback. Every chunk should cross the upstream link once however
many ranks want it (plans are strided over one global order, and the cache single-flights).

Figures: upstream_fetches_per_chunk (chunks fetched upstream ÷ chunks in the dataset),
node_goodput_mbit (bytes delivered to all ranks ÷ wall time of the slowest rank)."""
import json
import time

import _serving as S


def body(quick, argv):
    S.need("shardcached", "shardctl", "sc_datagen", "sc_trainer_bench")
    b = S.Bench("concurrency")
    ranks = 8
    record, chunk = 64 * 1024, 4 * S.MiB
    shards, per_shard = (8, 512) if quick else (16, 2048)  # 256 MiB quick, 2 GiB full
    dataset_bytes = shards * per_shard * record
    chunks_in_dataset = shards * ((per_shard * record + chunk - 1) // chunk)
    b.records_dataset("job", shards, per_shard, record, chunk_bytes=chunk)
    port = S.free_port()
    b.daemon("origin", "file://" + b.path("data"), origin_port=port, cache_size=0, memory_size=0)
    sock = b.path("node.sock")
    node = b.daemon("node", f"grpc://127.0.0.1:{port}", socket_path=sock,
                    cache_size=2 * dataset_bytes + 256 * S.MiB, memory_size=dataset_bytes + 64 * S.MiB,
                    segment_size=64 * S.MiB, prefetch=64 * S.MiB, arena=64 * S.MiB, slots=8)
    print(f"dataset: {dataset_bytes / S.MiB:.0f} MiB, {chunks_in_dataset} chunks; {ranks} ranks")
    m0 = node.metrics()
    t0 = time.perf_counter()
    procs = [b.trainer(sock, "job", batch_size=16, shuffle="global", seed=5, rank=r, world_size=ranks)
             for r in range(ranks)]
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise S.CannotMeasure(f"a rank failed: {err.strip()}")
        results.append(json.loads(out.splitlines()[-1]))
    wall = time.perf_counter() - t0
    m1 = node.metrics()
    fetched = (m1.get("shardcache_cache_upstream_fetched_chunks_total", 0) -
               m0.get("shardcache_cache_upstream_fetched_chunks_total", 0))
    delivered = sum(r["bytes"] for r in results)
    samples = sum(r["samples"] for r in results)
    if samples != shards * per_shard:
        raise S.CannotMeasure(f"ranks read {samples} samples, dataset has {shards * per_shard}")
    for r in results:
        print(f"  rank {r['rank']}: {r['samples']} samples, {r['mbit']:.0f} Mbit/s, "
              f"stall {r['stall_fraction']:.2f}")
    print(f"chunks fetched upstream: {fetched:.0f} for {chunks_in_dataset} chunks; "
          f"node goodput {delivered * 8 / wall / 1e6:.0f} Mbit/s over {wall:.1f} s")
    return {
        "upstream_fetches_per_chunk": round(fetched / chunks_in_dataset, 4),
        "node_goodput_mbit": round(delivered * 8 / wall / 1e6, 1),
        "ranks": ranks,
        "dataset_bytes": dataset_bytes,
        "wall_s": round(wall, 3),
    }


if __name__ == "__main__":
    S.main(body)
