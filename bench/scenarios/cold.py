#!/usr/bin/python3
"""bench/run cold [--quick] [--rtt-ms 30] [--rate-mbit 1000] [--window-kib 512] [--shuffle global]
                 [--stall-prob 0] [--stall-ms 0]

Cold epoch over a modelled long-distance link: origin shardcached (file upstream) → wanem
(/work/shared/tools/wanem.py, or $SHARDCACHE_WANEM) → node shardcached with an empty cache →
one sc_trainer_bench client reads one epoch through the node's local socket. Run once with
incompressible records and once with token records (uint16 Zipf ids, compressible); each kind
gets a fresh origin, wanem and node so nothing is cached. Peers in the same run: `aria2c` and
`curl` download the same incompressible shard files from nginx through a wanem with the same
settings; aria2c with 16 connections per file (-x16 -s16, its most) and 1, 4 and 8 files at a
time (-j), the best counting (aria2c_mbit, aria2c_best).

goodput = dataset bytes delivered to the client ÷ wall time of the client process.
link_mbit = the wanem rate; effective_over_link_<kind> = goodput ÷ link (it can exceed 1 for
compressible data, since the link carries compressed bytes). wire_bytes and compression_ratio
come from the node's shardcache_upstream_{wire,payload}_bytes_total counters. cpu_busy_<kind>
= CPU seconds of node, origin, wanem and client over the epoch ÷ (wall × cores): near 1, the
machine's cores, not the link or the fetcher, set the pace (all four share them).

Exit status: 0 measured, 1 could not measure, 2 wanem.py absent."""
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _serving as S  # noqa: E402
from fetch import start_nginx, wait_port  # noqa: E402

WANEM = os.environ.get("SHARDCACHE_WANEM", "/work/shared/tools/wanem.py")
CURL_SECONDS = 60
# aria2c settings tried: (-j files at a time, -x/-s connections per file).
ARIA2C_SETTINGS = [(1, 16), (4, 16), (8, 16)]


def parse_link(argv):
    """The link options of argv (--rtt-ms, --rate-mbit, --window-kib, --stall-prob, --stall-ms;
    the bench default link for those not given) and the other arguments, in order."""
    link = {"rtt_ms": 30.0, "rate_mbit": 1000.0, "window_kib": 512, "stall_prob": 0.0, "stall_ms": 0.0}
    rest = []
    it = iter(argv)
    for a in it:
        if a in ("--rtt-ms", "--rate-mbit", "--stall-prob", "--stall-ms"):
            link[a[2:].replace("-", "_")] = float(next(it))
        elif a == "--window-kib":
            link["window_kib"] = int(next(it))
        else:
            rest.append(a)
    return link, rest


def absent(why):
    """Exits with status 2 (a tool absent, BENCH.md) and the JSON line saying why."""
    print(f"cannot measure: {why}", file=sys.stderr)
    print(json.dumps({"error": why}))
    sys.exit(2)


def require_wanem():
    """Exits with status 2 when wanem.py is absent."""
    if not os.path.exists(WANEM):
        absent(f"{WANEM} is absent")


def parse_shuffle(rest):
    """The --shuffle option of what parse_link left (default global); CannotMeasure on others."""
    shuffle = "global"
    it = iter(rest)
    for a in it:
        if a == "--shuffle":
            shuffle = next(it)
        else:
            raise S.CannotMeasure(f"unknown option {a}")
    return shuffle


def start_wanem(b, name, upstream_port, link):
    port = S.free_port()
    ready = b.path(name + ".ready")
    log = open(b.path(name + ".log"), "w")
    p = subprocess.Popen(["/usr/bin/python3", WANEM, "--listen", f"127.0.0.1:{port}",
                          "--upstream", f"127.0.0.1:{upstream_port}",
                          "--rtt-ms", str(link["rtt_ms"]), "--rate-mbit", str(link["rate_mbit"]),
                          "--window-kib", str(link["window_kib"]),
                          "--stall-prob", str(link["stall_prob"]), "--stall-ms", str(link["stall_ms"]),
                          "--stats-file", b.path(name + ".stats.json"), "--ready-file", ready],
                         stdout=log, stderr=subprocess.STDOUT)
    b.procs.append(p)
    end = time.time() + 30
    while not os.path.exists(ready):
        if p.poll() is not None or time.time() > end:
            raise S.CannotMeasure(f"wanem did not start; log:\n{open(b.path(name + '.log')).read()[-1500:]}")
        time.sleep(0.05)
    return port, p


def stop(b, p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if p in b.procs:
        b.procs.remove(p)


def cold_epoch(b, kind, dataset, dataset_bytes, samples, link, shuffle):
    """Fresh origin → wanem → empty node; one client epoch. Returns the figures of this kind."""
    data_root = b.path("data")
    oport = S.free_port()
    origin = b.daemon(f"origin-{kind}", "file://" + data_root, origin_port=oport, cache_size=0,
                      memory_size=0)
    wport, wanem = start_wanem(b, f"wanem-{kind}", oport, link)
    sock = b.path(f"node-{kind}.sock")
    # The node runs the shipped defaults (config/shardcached.toml) but for the NVMe tier's size.
    node = b.daemon(f"node-{kind}", f"grpc://127.0.0.1:{wport}", socket_path=sock,
                    cache_size=2 * dataset_bytes + 512 * S.MiB, memory_size=256 * S.MiB,
                    segment_size=256 * S.MiB, prefetch=256 * S.MiB, arena=512 * S.MiB, slots=16)
    m0 = node.metrics()
    procs = {"node": node.proc, "origin": origin.proc, "wanem": wanem}
    cpu0 = {k: S.cpu_seconds(p.pid) for k, p in procs.items()}
    client0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = threading.Event()
    trace = []  # (seconds, stream limit, streams running, verified payload bytes)
    sampler = threading.Thread(target=sample_fetcher, args=(node, t0, done, trace), daemon=True)
    sampler.start()
    epochs = b.trainer_epochs(sock, dataset, batch_size=16, shuffle=shuffle, seed=7)
    wall = time.perf_counter() - t0
    cpu = {k: S.cpu_seconds(p.pid) - cpu0[k] for k, p in procs.items()}
    client1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the client, waited for
    cpu["client"] = client1.ru_utime + client1.ru_stime - client0.ru_utime - client0.ru_stime
    done.set()
    sampler.join()
    print_trace(kind, trace)
    m1 = node.metrics()
    if not epochs:
        raise S.CannotMeasure(f"sc_trainer_bench printed no epoch for {kind}")
    e = epochs[-1]
    if e["samples"] != samples:
        raise S.CannotMeasure(f"{kind}: client read {e['samples']} samples, dataset has {samples}")

    def delta(name):
        return m1.get(name, 0.0) - m0.get(name, 0.0)

    wire = delta("shardcache_upstream_wire_bytes_total")
    payload = delta("shardcache_upstream_payload_bytes_total")
    fetched = delta("shardcache_cache_upstream_fetched_chunks_total")
    hedges = delta("shardcache_upstream_hedges_total")
    for p in (node.proc, wanem, origin.proc):
        stop(b, p)
    busy = sum(cpu.values()) / (wall * (os.cpu_count() or 1))
    print(f"  {kind} CPU over the epoch: " + ", ".join(f"{k} {v:.1f} s" for k, v in cpu.items()) +
          f" = {busy:.2f} of {os.cpu_count()} cores busy")
    if wire <= 0:
        raise S.CannotMeasure(f"{kind}: node counted no upstream wire bytes (cache not cold?)")
    goodput = e["bytes"] * 8 / wall / 1e6
    ratio = payload / wire
    print(f"  {kind:14s}: {e['bytes'] / S.MiB:7.1f} MiB in {wall:6.2f} s = {goodput:7.1f} Mbit/s "
          f"goodput ({goodput / link['rate_mbit']:.2f} × link); wire {wire / S.MiB:.1f} MiB, "
          f"payload {payload / S.MiB:.1f} MiB (ratio {ratio:.2f}), {fetched:.0f} chunks fetched, {hedges:.0f} hedges, "
          f"client stall {e.get('stall_fraction', 0):.2f}, first batch {e.get('first_next_us', 0) / 1e3:.0f} ms, "
          f"stream limit {m1.get('shardcache_upstream_stream_limit', 0):.0f}")
    return {"goodput_mbit": goodput, "wire_bytes": int(wire), "compression_ratio": ratio,
            "effective_over_link": goodput / link["rate_mbit"], "wall_s": wall,
            "first_next_ms": e.get("first_next_us", 0) / 1e3, "hedges": int(hedges),
            "stream_limit": m1.get("shardcache_upstream_stream_limit", 0), "cpu_busy": busy}


def sample_fetcher(node, t0, done, trace):
    """Samples the node's fetcher every second until `done`: how the stream pool grew."""
    while not done.wait(1.0):
        try:
            m = node.metrics()
        except OSError:
            continue
        trace.append((time.perf_counter() - t0, m.get("shardcache_upstream_stream_limit", 0),
                      m.get("shardcache_upstream_fetches_in_flight", 0),
                      m.get("shardcache_upstream_payload_bytes_total", 0)))


def print_trace(kind, trace):
    """One line per tenth of the run: stream limit, streams running, goodput since the last."""
    if len(trace) < 2:
        return
    step = max(1, len(trace) // 10)
    points = trace[::step] + ([trace[-1]] if (len(trace) - 1) % step else [])
    parts = []
    for (t_a, _, _, b_a), (t_b, limit, running, b_b) in zip(points, points[1:]):
        parts.append(f"{t_b:.0f}s: {limit:.0f}/{running:.0f} {(b_b - b_a) * 8 / (t_b - t_a) / 1e6:.0f}")
    print(f"  {kind} fetcher (t: limit/running Mbit/s): " + ", ".join(parts))


def peers(b, dataset_dir, link):
    """aria2c (each of ARIA2C_SETTINGS) and curl fetch every shard of dataset_dir from nginx
    through wanem; returns (best aria2c Mbit/s, its setting, curl Mbit/s)."""
    root = os.path.dirname(dataset_dir)
    shards = sorted(f for f in os.listdir(dataset_dir) if f.endswith(".bin"))
    total = sum(os.path.getsize(os.path.join(dataset_dir, f)) for f in shards)
    nport = start_nginx(b, root)
    wport, wanem = start_wanem(b, "wanem-http", nport, link)
    base = f"http://127.0.0.1:{wport}/{os.path.basename(dataset_dir)}/"
    out = b.path("peer-out")
    os.makedirs(out, exist_ok=True)

    def check_and_clear():
        got = sum(os.path.getsize(os.path.join(out, f)) for f in shards if os.path.exists(os.path.join(out, f)))
        for f in os.listdir(out):
            os.unlink(os.path.join(out, f))
        return got

    lst = b.path("aria2.list")
    with open(lst, "w") as f:
        f.write("".join(base + s + "\n" for s in shards))
    aria = {}
    for jobs, conns in ARIA2C_SETTINGS:
        setting = f"-j{jobs} -x{conns} -s{conns}"
        t0 = time.perf_counter()
        r = subprocess.run(["aria2c", f"-x{conns}", f"-s{conns}", "-k1M", f"-j{jobs}", "-q", "--file-allocation=none",
                            "--allow-overwrite=true", "--auto-file-renaming=false", "-d", out, "-i", lst],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise S.CannotMeasure(f"aria2c {setting} failed ({r.returncode}): {r.stdout[-1000:]}")
        if check_and_clear() != total:
            raise S.CannotMeasure(f"aria2c {setting} downloaded a different byte count")
        aria[setting] = total * 8 / wall / 1e6
        print(f"  aria2c {setting}: {total / S.MiB:.1f} MiB in {wall:.2f} s = {aria[setting]:.1f} Mbit/s")
    # curl, one file at a time, for at most CURL_SECONDS: one connection on a narrow window
    # (64 KiB / 150 ms = 3.5 Mbit/s) would take most of an hour for the whole dataset; its rate
    # is the bytes it wrote over the time it ran.
    t0 = time.perf_counter()
    for s in shards:
        left = CURL_SECONDS - (time.perf_counter() - t0)
        if left <= 0:
            break
        c = subprocess.run(["curl", "-s", "-f", "--max-time", f"{left:.1f}", "-o", os.path.join(out, s), base + s])
        if c.returncode == 28:  # --max-time reached; the partial file counts
            break
        if c.returncode != 0:
            raise S.CannotMeasure(f"curl failed with {c.returncode}")
    curl_wall = time.perf_counter() - t0
    curl_bytes = check_and_clear()
    if curl_bytes <= 0:
        raise S.CannotMeasure("curl downloaded nothing")
    stop(b, wanem)
    curl = curl_bytes * 8 / curl_wall / 1e6
    print(f"  curl (one file at a time): {curl_bytes / S.MiB:.1f} MiB in {curl_wall:.2f} s = {curl:.1f} Mbit/s")
    best = max(aria, key=aria.get)
    return aria[best], best, curl


def body(quick, argv):
    link, rest = parse_link(argv)
    shuffle = parse_shuffle(rest)
    require_wanem()
    S.need("shardcached", "shardctl", "sc_datagen", "sc_trainer_bench")
    for tool in ("nginx", "aria2c", "curl"):
        if subprocess.run(["which", tool], stdout=subprocess.DEVNULL).returncode != 0:
            raise S.CannotMeasure(f"{tool} is not installed (deploy/setup.sh)")
    b = S.Bench("cold")
    record = 64 * 1024
    shards, per_shard = (4, 256) if quick else (8, 2048)  # 64 MiB quick, 1 GiB full
    dataset_bytes = shards * per_shard * record
    print(f"link: wanem rtt {link['rtt_ms']:g} ms, rate {link['rate_mbit']:g} Mbit/s, window "
          f"{link['window_kib']} KiB per connection, stalls p={link['stall_prob']:g} x {link['stall_ms']:g} ms; dataset {dataset_bytes / S.MiB:.0f} MiB per kind "
          f"({shards} shards of {per_shard} × {record // 1024} KiB records, 4 MiB chunks), "
          f"shuffle {shuffle}, cold node cache")
    ds = {}
    for kind, gen in (("incompressible", "random"), ("tokens", "tokens")):
        ds[kind] = b.records_dataset(kind, shards, per_shard, record, kind=gen)
    res = {kind: cold_epoch(b, kind, kind, dataset_bytes, shards * per_shard, link, shuffle)
           for kind in ds}
    aria, aria_best, curl = peers(b, ds["incompressible"], link)
    inc, tok = res["incompressible"], res["tokens"]
    best = max(aria, curl)
    print(f"goodput/best peer (incompressible; aria2c best: {aria_best}): {inc['goodput_mbit'] / best:.2f}")
    return {
        "goodput_mbit": round(inc["goodput_mbit"], 1),
        "goodput_mbit_tokens": round(tok["goodput_mbit"], 1),
        "link_mbit": link["rate_mbit"],
        "effective_over_link": round(inc["effective_over_link"], 3),
        "effective_over_link_incompressible": round(inc["effective_over_link"], 3),
        "effective_over_link_tokens": round(tok["effective_over_link"], 3),
        "wire_bytes": inc["wire_bytes"],
        "wire_bytes_tokens": tok["wire_bytes"],
        "compression_ratio": round(inc["compression_ratio"], 3),
        "compression_ratio_tokens": round(tok["compression_ratio"], 3),
        "aria2c_mbit": round(aria, 1),
        "aria2c_best": aria_best,
        "curl_mbit": round(curl, 1),
        "over_best_peer": round(inc["goodput_mbit"] / best, 3),
        "first_next_ms": round(inc["first_next_ms"], 1),
        "first_next_ms_tokens": round(tok["first_next_ms"], 1),
        "stream_limit": inc["stream_limit"],
        "cpu_busy_incompressible": round(inc["cpu_busy"], 3),
        "cpu_busy_tokens": round(tok["cpu_busy"], 3),
        "dataset_bytes": dataset_bytes,
        "rtt_ms": link["rtt_ms"],
        "window_kib": link["window_kib"],
        "stall_prob": link["stall_prob"],
        "stall_ms": link["stall_ms"],
        "shuffle": shuffle,
    }


if __name__ == "__main__":
    S.main(body)
