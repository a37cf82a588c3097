#!/usr/bin/env python3
"""bench/run latency — a warm cache and a trainer that "computes" (sleeps) for a fixed time per
batch: how long does Next() take, and what fraction of the wall time does the trainer wait?

"Warm" means every chunk is in the cache's DRAM tier (sized to hold the dataset) as well as
on its NVMe tier. The arena is split into slots just larger than a batch (256 MiB in 2 MiB
slots for 1 MiB batches), as config/shardcached.toml advises, so the loader may run up to 64
batches ahead (its batch ring) of the trainer. The compute time is set to twice the measured batch read time (an epoch read back to back
with no compute, in the same run) — the boundary of the target stall_fraction ≤ 0.02.

Figures: next_p50_us, next_p99_us, stall_fraction (time waiting in Next ÷ wall), plus
read_us_per_batch and compute_us, and where the stall went: the first Next (loader start-up),
the Next calls over 1 ms (slow_nexts, slow_next_stall_fraction: a daemon or trainer thread that
was not running, or data not ready), and the rest (the cost of each call)."""
import _serving as S


def body(quick, argv):
    S.need("shardcached", "shardctl", "sc_datagen", "sc_trainer_bench")
    b = S.Bench("latency")
    record, chunk = 64 * 1024, 4 * S.MiB
    shards, per_shard = (4, 1024) if quick else (8, 4096)  # 256 MiB quick, 2 GiB full
    dataset_bytes = shards * per_shard * record
    b.records_dataset("warm", shards, per_shard, record, chunk_bytes=chunk)
    sock = b.path("node.sock")
    node = b.daemon("node", "file://" + b.path("data"), socket_path=sock,
             cache_size=2 * dataset_bytes + 256 * S.MiB, memory_size=dataset_bytes + 128 * S.MiB,
             segment_size=64 * S.MiB, prefetch=64 * S.MiB, arena=256 * S.MiB, slots=128)
    common = dict(batch_size=16, shuffle="global", seed=9)
    b.trainer_epochs(sock, "warm", epoch=0, **common)  # fill
    free = b.trainer_epochs(sock, "warm", epoch=1, **common)[0]
    read_us = free["wall_s"] / free["batches"] * 1e6
    compute_us = int(2 * read_us) + 1
    print(f"dataset {dataset_bytes / S.MiB:.0f} MiB, batches of 16 x 64 KiB; warm read back to back: "
          f"{read_us:.0f} us per batch → compute {compute_us} us per batch")
    node.wait_no_clients()
    r = b.trainer_epochs(sock, "warm", epoch=2, compute_us=compute_us, **common)[0]
    print(f"OpenLoader {r['open_us'] / 1e3:.1f} ms (faults in the slots' fronts; not in the wall time); "
          f"first Next (loader start-up) {r['first_next_us']:.0f} us, max {r['max_next_us']:.0f} us")
    print(f"with compute: next p50 {r['next_p50_us']:.0f} us, p99 {r['next_p99_us']:.0f} us, "
          f"stall {r['stall_s']:.3f} s of {r['wall_s']:.2f} s = {r['stall_fraction']:.4f}")
    first_s = r["first_next_us"] / 1e6
    rest_s = max(0.0, r["stall_s"] - first_s - r["slow_next_s"])
    print(f"stall: first Next {first_s * 1e3:.1f} ms, {r['slow_nexts']} calls over 1 ms "
          f"{r['slow_next_s'] * 1e3:.1f} ms, the other {r['batches'] - 1 - r['slow_nexts']} calls "
          f"{rest_s * 1e3:.1f} ms ({rest_s / max(1, r['batches'] - 1 - r['slow_nexts']) * 1e6:.1f} us each); "
          f"the daemon waited for data {r['daemon_wait_us'] / 1e3:.1f} ms in all")
    return {
        "next_p50_us": round(r["next_p50_us"], 1),
        "next_p99_us": round(r["next_p99_us"], 1),
        "stall_fraction": round(r["stall_fraction"], 5),
        "read_us_per_batch": round(read_us, 1),
        "compute_us": compute_us,
        "batches": r["batches"],
        "first_next_us": round(r["first_next_us"], 1),
        "open_loader_us": round(r["open_us"], 1),
        "slow_nexts": r["slow_nexts"],
        "slow_next_stall_fraction": round(r["slow_next_s"] / r["wall_s"], 5),
        "daemon_wait_ms": round(r["daemon_wait_us"] / 1e3, 1),
        # Without the loader start-up (the first Next of the epoch).
        "steady_stall_fraction": round(max(0.0, r["stall_s"] - r["first_next_us"] / 1e6) / r["wall_s"], 5),
    }


if __name__ == "__main__":
    S.main(body)
