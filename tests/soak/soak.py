#!/usr/bin/env python3
"""make soak — epochs for an hour with faults injected, measuring the node daemon's drift.

  tests/soak/soak.py [--minutes 60] [--json FILE] [--smaps-dir DIR]

Real processes on loopback: an origin shardcached serving a records dataset (8 shards x 2000
records of 4 KiB, random bytes, 256 KiB chunks), a node shardcached in front of it (NVMe tier
256 MiB, DRAM tier 8 MiB, so reads come off the segment files), and 2 trainer processes per epoch
(tests/soak/soak_trainer.py, the Python client) reading rank 0 and 1 of a globally shuffled epoch
and checking every sample's bytes against the shard files. Epoch e injects:

  every 2nd epoch   an extra trainer killed with SIGKILL mid-epoch (a client gone mid-batch);
  every 5th epoch   64 bytes flipped at random places in the node's segment files (corruption
                    the node must detect and re-fetch, never serve);
  every 7th epoch   the origin killed with SIGKILL and started again 2 s later, while the
                    ranks read (chunks dropped as corrupt must then wait for it).

After each epoch the node's RSS, open fds and threads are read from /proc. The baseline is the
first epoch after a tenth of the run (and after epoch 5) with the NVMe tier at 90 % of its
budget or more AND turned over once (evicted bytes >= its budget: every segment has been
recycled, so the allocator has seen the whole cycle of segment files, index entries, memtable
flushes and compactions the steady state repeats), and every kind of fault has been seen.
drift = (last - baseline) / baseline, each the median of 10 epochs. The JSON also carries the
RSS drift from the first epoch the tier was full (rss_mib_drift_from_full): the difference is
the allocator's warm-up over the first turnover (a 1-hour soak measured RSS rising ~3.5 MiB
over it, live heap flat, the growth in the main malloc arena's resident pages, then flat for
the remaining 50 minutes). The node is never restarted, so drift is one process's. The JSON also
carries index_mib, the memory RocksDB holds for the NVMe tier's index
(shardcache_cache_index_memory_bytes: memtables, block cache, table readers; bounded by the
index's options), to tell its filling from a leak, and heap_in_use_mib / heap_free_mib (malloc's
live and free heap, shardcache_process_heap_*_bytes) to tell a leak from fragmentation. Exit
status 1 when a sample had wrong bytes,
an epoch did not deliver every sample exactly once, or the RSS, fd or thread drift is 5 % or
more; the JSON figures are printed last either way."""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../bench/scenarios"))
import _serving as S  # noqa: E402  (the bench's daemon/dataset plumbing)

RECORD_BYTES = 4096
SHARDS, PER_SHARD = 8, 2000
WORLD = 2
BASELINE_EPOCH = 5
DRIFT_LIMIT = 0.05
HERE = os.path.dirname(os.path.abspath(__file__))


def proc_figures(pid):
    """RSS (and its anonymous part), open fds, and threads of the process. io_uring's kernel
    workers (iou-wrk-*) are listed among a process's threads but come and go with the kernel's
    io-wq load, so they are counted apart."""
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    threads = io_workers = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                name = f.read()
        except OSError:
            continue
        if name.startswith("iou-wrk"):
            io_workers += 1
        else:
            threads += 1
    return {"rss_mib": int(status["VmRSS"].split()[0]) / 1024.0,
            "rss_anon_mib": int(status["RssAnon"].split()[0]) / 1024.0,
            "threads": threads, "io_uring_workers": io_workers,
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def flip_bytes(cache_dir, count, rng):
    segs = [os.path.join(cache_dir, f) for f in os.listdir(cache_dir) if f.startswith("seg-")]
    segs = [s for s in segs if os.path.getsize(s) > 0]
    flipped = 0
    for _ in range(count if segs else 0):
        path = rng.choice(segs)
        try:
            with open(path, "r+b") as f:
                off = rng.randrange(os.path.getsize(path))
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ 0xFF]))
                flipped += 1
        except (FileNotFoundError, ValueError):
            pass  # the node evicted (deleted or emptied) the segment meanwhile
    return flipped


def trainer(b, sock, data_dir, epoch, rank):
    env = dict(os.environ, PYTHONPATH=os.path.join(S.BUILD, "python"))
    p = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "soak_trainer.py"), sock, data_dir,
                          str(RECORD_BYTES), str(epoch), str(rank), str(WORLD)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    b.procs.append(p)
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--json", default="")
    ap.add_argument("--smaps-dir", default="",
                    help="save the node's /proc/PID/smaps every 20th epoch here (to diff what grew)")
    args = ap.parse_args()
    S.need("shardcached", "shardctl", "sc_datagen")
    b = S.Bench("soak")
    rng = random.Random(7)
    data = b.records_dataset("soak", SHARDS, PER_SHARD, RECORD_BYTES, chunk_bytes=256 << 10)
    origin_port = S.free_port()
    origin = b.daemon("origin", "file://" + os.path.dirname(data), origin_port=origin_port)
    sock = b.path("node.sock")
    node = b.daemon("node", f"grpc://127.0.0.1:{origin_port}", socket_path=sock,
                    cache_size=256 << 20, memory_size=8 << 20, segment_size=8 << 20,
                    prefetch=32 << 20, arena=64 << 20, slots=16)
    samples_per_epoch = SHARDS * PER_SHARD

    figures = {"epochs": 0, "samples_checked": 0, "wrong_bytes_samples": 0, "incomplete_epochs": 0,
               "clients_killed": 0, "bytes_flipped": 0, "origin_kills": 0}
    failures = []
    baseline = None
    samples = []
    end = time.time() + args.minutes * 60
    warm_at = time.time() + args.minutes * 6  # a tenth of the run
    baseline_index = 0
    full_index = None  # the first warm epoch with the tier full, before its first turnover
    epoch = 0
    while time.time() < end:
        epoch += 1
        ranks = [trainer(b, sock, data, epoch, r) for r in range(WORLD)]
        if epoch % 2 == 0:
            victim = trainer(b, sock, data, epoch + 1000, 0)
            time.sleep(rng.uniform(0.5, 1.5))
            victim.kill()
            victim.wait()
            figures["clients_killed"] += 1
        if epoch % 5 == 0:
            figures["bytes_flipped"] += flip_bytes(node.cache_dir, 64, rng)
        if epoch % 7 == 0:
            origin.proc.kill()
            origin.proc.wait()
            figures["origin_kills"] += 1
            time.sleep(2)
            origin = b.daemon("origin", "file://" + os.path.dirname(data), origin_port=origin_port)
        got = 0
        for r, p in enumerate(ranks):
            out, err = p.communicate(timeout=600)
            if p.returncode != 0:
                failures.append(f"epoch {epoch} rank {r} exited {p.returncode}: {err.strip()[-500:]}")
                continue
            res = json.loads(out.strip().splitlines()[-1])
            got += res["samples"]
            figures["wrong_bytes_samples"] += res["wrong"]
        figures["samples_checked"] += got
        if got != samples_per_epoch:
            figures["incomplete_epochs"] += 1
            failures.append(f"epoch {epoch}: {got} of {samples_per_epoch} samples")
        figures["epochs"] = epoch
        node.wait_no_clients()
        # The node returns its free heap once the last client's loaders are torn down, within
        # a poll round (200 ms) of the connection count reaching 0: read it after that, or the
        # readings alternate between before and after.
        time.sleep(0.6)
        now = proc_figures(node.proc.pid)
        m = node.metrics()
        # RocksDB's share (memtables, block cache): bounded, and apart from any leak of ours.
        now["index_mib"] = m.get("shardcache_cache_index_memory_bytes", 0) / S.MiB
        # malloc's live heap (a leak grows it) and its free heap (fragmentation grows it).
        now["heap_in_use_mib"] = m.get("shardcache_process_heap_in_use_bytes", 0) / S.MiB
        now["heap_free_mib"] = m.get("shardcache_process_heap_free_bytes", 0) / S.MiB
        samples.append(now)
        if epoch % 20 == 0 and args.smaps_dir:
            os.makedirs(args.smaps_dir, exist_ok=True)
            with open(f"/proc/{node.proc.pid}/smaps") as f, \
                    open(os.path.join(args.smaps_dir, f"epoch{epoch:05d}.smaps"), "w") as out:
                out.write(f.read())
        if epoch % 20 == 0:
            print(f"soak: epoch {epoch}, {int(end - time.time())} s left: " +
                  ", ".join(f"{k} {v:.1f}" for k, v in now.items()), file=sys.stderr, flush=True)
        # Steady state: the NVMe tier at its budget (re-stored corrupt chunks fill it with new
        # segments, each with its file and index entries, until eviction keeps it level).
        budget = m.get("shardcache_cache_nvme_budget_bytes", 1)
        full = m.get("shardcache_cache_nvme_used_bytes", 0) >= 0.9 * budget
        turned_over = m.get("shardcache_cache_evicted_bytes_total", 0) >= budget
        warm = epoch >= BASELINE_EPOCH and time.time() >= warm_at and full
        if full_index is None and warm:
            full_index = len(samples) - 1
        if baseline is None and warm and turned_over:
            baseline, baseline_index = now, len(samples) - 1
        if failures and len(failures) > 5:
            break

    m = node.metrics()
    figures["checksum_failures"] = m.get("shardcache_cache_checksum_failures_total", 0)
    figures["minutes"] = round(args.minutes, 1)
    # Medians of 10 epochs at each end: one reading can catch the node mid-teardown.
    if baseline and len(samples) >= baseline_index + 20:
        head, tail = samples[baseline_index:baseline_index + 10], samples[-10:]
        baseline = {k: statistics.median(x[k] for x in head) for k in head[0]}
        last = {k: statistics.median(x[k] for x in tail) for k in tail[0]}
        for k in ("rss_mib", "fds", "threads", "index_mib", "heap_in_use_mib", "heap_free_mib"):
            figures[f"{k}_baseline"] = round(baseline[k], 1)
            figures[f"{k}_last"] = round(last[k], 1)
            figures[f"{k}_max"] = round(max(s[k] for s in samples[baseline_index:]), 1)
            drift = (last[k] - baseline[k]) / baseline[k] if baseline[k] else 0.0
            figures[f"{k}_drift"] = round(drift, 4)
            if drift >= DRIFT_LIMIT and k in ("rss_mib", "fds", "threads"):
                failures.append(f"{k} drifted {drift:+.1%} (baseline {baseline[k]}, last {last[k]})")
        if full_index is not None:
            full_rss = statistics.median(x["rss_mib"] for x in samples[full_index:full_index + 10])
            figures["rss_mib_from_full"] = round(full_rss, 1)
            figures["rss_mib_drift_from_full"] = round((last["rss_mib"] - full_rss) / full_rss, 4)
            figures["full_epoch"] = full_index + 1
        figures["series"] = [{"epoch": i + 1, **{k: round(v, 1) for k, v in s.items()}}
                             for i, s in enumerate(samples) if (i + 1) % max(1, len(samples) // 12) == 0]
    else:
        failures.append(f"only {epoch} epochs ran; no baseline (taken after epoch {BASELINE_EPOCH}, a tenth "
                        "of the run and the NVMe tier at 90 % of its budget and turned over once, with 20 epochs "
                        "after it)")
    figures["baseline_epoch"] = baseline_index + 1
    if figures["wrong_bytes_samples"]:
        failures.append(f"{figures['wrong_bytes_samples']} samples had wrong bytes")
    figures["failures"] = failures
    text = json.dumps(figures)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    for line in failures:
        print("soak: " + line, file=sys.stderr)
    print(text)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
