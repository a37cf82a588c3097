#!/usr/bin/env python3
"""bench/run restart — warm restart of a node cache holding 1,000,000 chunk entries.

1. build/bin/cache_bench restart-fill writes 1,000,000 chunks (4 KiB, the smallest chunk a
   manifest allows) into an NVMe tier through the real write path (segments + group-committed
   RocksDB index): about 4 GiB on disk.
2. The daemon (build/bin/shardcached, upstream a file:// origin directory, cache.dir = that tier)
   is started and timed from exec to ready (its /metrics answering after recovery); its RSS is
   read from /proc after ready. Then it is stopped and started once more, and the second start
   is reported (the first may pay for RocksDB compaction of the fresh index).
   Without shardcached, cache_bench restart-open opens the tier in a fresh process instead
   (same recovery code), and the JSON says so ("via": "cache_bench").

Options: --entries N (default 1000000; --quick also 1000000, it is the figure under test).

Figures: restart_ready_s, rss_mib (after ready), entries."""
import json
import os
import subprocess
import time

import _serving as S


def daemon_start(b, cache_dir, origin_dir, name):
    port = S.free_port()
    cfg = b.path(name + ".toml")
    with open(cfg, "w") as f:
        f.write(f"""upstream = "file://{origin_dir}"
[listen]
origin = ""
socket = ""
metrics = "127.0.0.1:{port}"
[cache]
dir = "{cache_dir}"
size = "1TiB"
memory_size = "64MiB"
eviction = "lru"
min_free = "0"
[log]
level = "warn"
""")
    log = open(b.path(name + ".log"), "w")
    t0 = time.perf_counter()
    p = subprocess.Popen([os.path.join(S.BIN, "shardcached"), "--config", cfg], stdout=log, stderr=subprocess.STDOUT)
    b.procs.append(p)
    d = S.Daemon(p, port, "", cache_dir, b.path(name + ".log"))
    d.wait_ready(timeout=120)
    ready = time.perf_counter() - t0
    with open(f"/proc/{p.pid}/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024.0
    return p, ready, rss


def body(quick, argv):
    S.need("cache_bench")
    entries = 1000000
    it = iter(argv)
    for a in it:
        if a == "--entries":
            entries = int(next(it))
        else:
            raise S.CannotMeasure(f"unknown option {a}")
    b = S.Bench("restart")
    cache_dir = b.path("cache")
    t0 = time.perf_counter()
    out = b.run(os.path.join(S.BIN, "cache_bench"), "restart-fill", "--dir", cache_dir, "--entries", entries)
    print(out.strip(), f"(fill took {time.perf_counter() - t0:.1f} s)")
    figures = {"entries": entries}
    if os.access(os.path.join(S.BIN, "shardcached"), os.X_OK):
        origin = b.path("origin")
        os.makedirs(origin, exist_ok=True)
        results = []
        for i in range(2):
            p, ready, rss = daemon_start(b, cache_dir, origin, f"node{i}")
            print(f"start {i + 1}: ready after {ready:.3f} s, RSS {rss:.1f} MiB")
            results.append((ready, rss))
            p.terminate()
            p.wait(timeout=60)
        figures.update({"restart_ready_s": round(results[-1][0], 4), "rss_mib": round(results[-1][1], 1),
                        "first_start_ready_s": round(results[0][0], 4), "via": "shardcached"})
    else:
        print("shardcached is not built; opening the tier with cache_bench restart-open instead")
        runs = []
        for i in range(2):
            t0 = time.perf_counter()
            line = b.run(os.path.join(S.BIN, "cache_bench"), "restart-open", "--dir", cache_dir).strip().splitlines()[-1]
            wall = time.perf_counter() - t0
            r = json.loads(line)
            print(f"open {i + 1}: recovery {r['restart_ready_s']:.3f} s (process wall {wall:.3f} s), "
                  f"{r['entries']} entries, RSS {r['rss_mib']:.1f} MiB (peak {r['rss_hwm_mib']:.1f})")
            runs.append((r, wall))
        r, wall = runs[-1]
        figures.update({"restart_ready_s": round(wall, 4), "recovery_s": r["restart_ready_s"],
                        "rss_mib": r["rss_mib"], "rss_hwm_mib": r["rss_hwm_mib"], "via": "cache_bench"})
        if r["entries"] != entries:
            raise S.CannotMeasure(f"recovered {r['entries']} entries, expected {entries}")
    ok = figures["restart_ready_s"] <= 3 and figures["rss_mib"] <= 256
    print(f"target restart_ready_s <= 3 and rss_mib <= 256: {'met' if ok else 'MISSED'}")
    return figures


if __name__ == "__main__":
    S.main(body)
