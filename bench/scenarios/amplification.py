#!/usr/bin/env python3
"""bench/run amplification — bytes fetched upstream per dataset byte delivered, for a cold
epoch of small samples (16 KiB records in 4 MiB chunks), with `global` and with `block`
shuffle.

Setup: an origin shardcached (file upstream) and a node shardcached fetching from it over
gRPC on loopback. The node's cache holds a quarter of the dataset (DRAM tier only, no NVMe
tier), the realistic case where the dataset is larger than the cache; the prefetch lookahead
is 16 MiB.

  block   one whole cold epoch: windows of shards are read in shuffled order, each chunk is
          fetched about once → fetched_over_dataset_block ≈ 1.
  global  every 16 KiB sample lands in a random 4 MiB chunk. The dataset does not fit the
          cache, so the node reads pieces-only: each miss fetches the 16 KiB blocks covering its
          sample (verified against the chunk's Merkle block table) and keeps nothing, instead of
          a whole 4 MiB chunk per sample (~190x the dataset before block ranges). The whole
          epoch is read (--quick: a 512-sample prefix); `global_samples` says how many.

Figures: fetched_over_dataset_global, fetched_over_dataset_block."""
import _serving as S


def body(quick, argv):
    S.need("shardcached", "shardctl", "sc_datagen", "sc_trainer_bench")
    b = S.Bench("amplification")
    record, chunk = 16 * 1024, 4 * S.MiB
    shards, per_shard = (8, 2048) if quick else (16, 4096)  # 256 MiB quick, 1 GiB full
    dataset_bytes = shards * per_shard * record
    cache_bytes = dataset_bytes // 4
    b.records_dataset("small", shards, per_shard, record, chunk_bytes=chunk)
    print(f"dataset: {dataset_bytes / S.MiB:.0f} MiB of 16 KiB records in 4 MiB chunks; "
          f"node cache {cache_bytes / S.MiB:.0f} MiB (DRAM tier only)")
    port = S.free_port()
    b.daemon("origin", "file://" + b.path("data"), origin_port=port, cache_size=0, memory_size=0)
    figures = {"dataset_bytes": dataset_bytes, "cache_bytes": cache_bytes}
    for mode in ("block", "global"):
        sock = b.path(f"node-{mode}.sock")
        node = b.daemon(f"node-{mode}", f"grpc://127.0.0.1:{port}", socket_path=sock, cache_size=0,
                        memory_size=cache_bytes, prefetch=16 * S.MiB, arena=64 * S.MiB, slots=8)
        m0 = node.metrics()
        kw = dict(batch_size=64, shuffle=mode, seed=3)
        if mode == "global" and quick:
            kw["max_batches"] = 512 // 64
        r = b.trainer_epochs(sock, "small", **kw)[0]
        m1 = node.metrics()
        fetched = (m1.get("shardcache_upstream_payload_bytes_total", 0) -
                   m0.get("shardcache_upstream_payload_bytes_total", 0))
        chunks = (m1.get("shardcache_cache_upstream_fetched_chunks_total", 0) -
                  m0.get("shardcache_cache_upstream_fetched_chunks_total", 0))
        if fetched == 0:
            fetched = chunks * chunk  # the payload counter is absent: count whole chunks
        ratio = fetched / r["bytes"] if r["bytes"] else float("nan")
        print(f"{mode:6s}: delivered {r['bytes'] / S.MiB:.1f} MiB ({r['samples']} samples) in "
              f"{r['wall_s']:.1f} s, fetched {fetched / S.MiB:.1f} MiB in {chunks:.0f} chunks "
              f"→ {ratio:.2f} bytes fetched per byte delivered")
        figures[f"fetched_over_dataset_{mode}"] = round(ratio, 3)
        figures[f"{mode}_samples"] = r["samples"]
    return figures


if __name__ == "__main__":
    S.main(body)
