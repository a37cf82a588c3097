#!/usr/bin/python3
"""bench/run cluster [--quick] [--rtt-ms 30] [--rate-mbit 1000] [--window-kib 512] [--nodes 1,2,4]

A cluster behind one long link: one origin shardcached (file upstream) → wanem (the link,
/work/shared/tools/wanem.py or $SHARDCACHE_WANEM) → N node daemons, each with an empty cache
and one sc_trainer_bench client reading the whole dataset (global shuffle) through its local
socket, all N started together. For each N the run is made twice, each time with a fresh origin,
wanem and nodes:
  group        the N nodes form one peer group ([peers] members = every node's origin port):
               each chunk crosses the link once, from its owner, and moves between nodes on
               loopback (the cluster network);
  independent  the same N nodes without [peers]: each pulls its own copy across the link.

origin_bytes_over_dataset = payload bytes the origin served (shardcache_origin_payload_bytes_total)
  ÷ dataset bytes, in the group run (1.00 = each byte crossed the link once for the whole group);
node_goodput_mbit = mean over the nodes of dataset bytes ÷ that node's client wall time;
wall_over_independent = wall time of the group run ÷ wall time of the independent run (the
  slowest node of each); below 1 the group finished sooner than N nodes on their own.
The top-level keys are those of the largest N; `per_n` holds every N.

Exit status: 0 measured, 1 could not measure, 2 wanem.py absent."""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _serving as S  # noqa: E402
from cold import parse_link, require_wanem, start_wanem, stop  # noqa: E402


def start_nodes(b, tag, n, upstream, dataset_bytes, group):
    """N node daemons on `upstream`; as one peer group when `group`. Returns (daemon, socket) pairs."""
    ports = [S.free_port() for _ in range(n)]
    extra = ""
    if group:
        members = ", ".join(f'"127.0.0.1:{p}"' for p in ports)
        extra = f'[peers]\nmembers = [{members}]\n'
    nodes = []
    for i, port in enumerate(ports):
        sock = b.path(f"{tag}-node{i}.sock")
        d = b.daemon(f"{tag}-node{i}", upstream, socket_path=sock, origin_port=port,
                     cache_size=2 * dataset_bytes + 512 * S.MiB, memory_size=0, segment_size=64 * S.MiB,
                     prefetch=256 * S.MiB, arena=256 * S.MiB, slots=16, extra=extra)
        nodes.append((d, sock))
    if group:
        deadline = time.time() + 30
        while not all(usable_members(d) == n for d, _ in nodes):
            if time.time() > deadline:
                raise S.CannotMeasure(f"{tag}: the peer group did not see all {n} members within 30 s")
            time.sleep(0.2)
    return nodes


def usable_members(d):
    m = d.metrics()
    return sum(v for k, v in m.items() if k.startswith("shardcache_peer_usable{"))


def run_epochs(b, nodes, dataset, samples):
    """One client per node, started together; returns each client's wall time in seconds."""
    t0 = time.perf_counter()
    procs = [b.trainer(sock, dataset, batch_size=16, shuffle="global", seed=7 + i)
             for i, (_, sock) in enumerate(nodes)]
    results = [None] * len(procs)

    def wait(i):  # each client timed at its own end, not when the one before it ended
        out, err = procs[i].communicate()
        results[i] = (time.perf_counter() - t0, out, err)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(len(procs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    walls = []
    for i, (wall, out, err) in enumerate(results):
        if procs[i].returncode != 0:
            raise S.CannotMeasure(f"sc_trainer_bench on node {i} failed: {err.strip()[-1500:]}")
        epochs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if not epochs or epochs[-1]["samples"] != samples:
            raise S.CannotMeasure(f"node {i}: client read {epochs[-1]['samples'] if epochs else 0} of {samples} samples")
        walls.append(wall)
    return walls


def one_run(b, tag, n, link, dataset, dataset_bytes, samples, group):
    """Fresh origin → wanem → N empty nodes; every node reads the dataset once."""
    oport = S.free_port()
    origin = b.daemon(f"{tag}-origin", "file://" + b.path("data"), origin_port=oport, cache_size=0,
                      memory_size=0)
    wport, wanem = start_wanem(b, f"{tag}-wanem", oport, link)
    nodes = start_nodes(b, tag, n, f"grpc://127.0.0.1:{wport}", dataset_bytes, group)
    o0 = origin.metric("shardcache_origin_payload_bytes_total")
    walls = run_epochs(b, nodes, dataset, samples)
    origin_bytes = origin.metric("shardcache_origin_payload_bytes_total") - o0
    peer_bytes = sum(sum(v for k, v in d.metrics().items() if k.startswith("shardcache_peer_bytes_total{"))
                     for d, _ in nodes)
    peer_errors = sum(sum(v for k, v in d.metrics().items() if k.startswith("shardcache_peer_errors_total{"))
                      for d, _ in nodes)
    hedges = sum(d.metric("shardcache_upstream_hedges_total") for d, _ in nodes)
    range_hedges = sum(d.metric("shardcache_upstream_range_hedges_total") for d, _ in nodes)
    # Where the origin's bytes went: per node, whole chunks and block ranges fetched upstream.
    for i, (d, _) in enumerate(nodes):
        print(f"    node {i}: upstream {d.metric('shardcache_upstream_payload_bytes_total') / S.MiB:6.1f} MiB in "
              f"{d.metric('shardcache_upstream_chunks_total'):.0f} chunks + "
              f"{d.metric('shardcache_upstream_block_ranges_total'):.0f} block ranges, "
              f"{d.metric('shardcache_upstream_hedges_total'):.0f} hedges")
    for i in range(n) if peer_errors else ():
        with open(b.path(f"{tag}-node{i}.log")) as f:
            for line in (l for l in f if "failed a read" in l):
                print(f"    node {i}: {line.strip()[-300:]}")
    for d, _ in nodes:
        stop(b, d.proc)
    stop(b, wanem)
    stop(b, origin.proc)
    goodput = sum(dataset_bytes * 8 / w / 1e6 for w in walls) / n
    print(f"  N={n} {'group' if group else 'independent':11s}: wall {max(walls):6.2f} s, node goodput "
          f"{goodput:7.1f} Mbit/s (mean), origin served {origin_bytes / S.MiB:7.1f} MiB "
          f"({origin_bytes / dataset_bytes:.2f} × dataset), {peer_bytes / S.MiB:.1f} MiB from group members, "
          f"{peer_errors:.0f} member read errors, {hedges:.0f} hedged fetches "
          f"({range_hedges:.0f} of block ranges)")
    return {"wall_s": max(walls), "node_goodput_mbit": goodput, "origin_bytes": origin_bytes}


def parse(argv):
    link, rest = parse_link(argv)
    sizes = [1, 2, 4]
    it = iter(rest)
    for a in it:
        if a == "--nodes":
            sizes = sorted({int(x) for x in next(it).split(",")})
            if not sizes or sizes[0] < 1 or sizes[-1] > 16:
                raise S.CannotMeasure("--nodes takes node counts between 1 and 16, e.g. 1,2,4")
        else:
            raise S.CannotMeasure(f"unknown option {a}")
    return link, sizes


def body(quick, argv):
    link, sizes = parse(argv)
    require_wanem()
    S.need("shardcached", "shardctl", "sc_datagen", "sc_trainer_bench")
    b = S.Bench("cluster")
    record = 64 * 1024
    shards, per_shard = (2, 128) if quick else (4, 1024)  # 16 MiB quick, 256 MiB full
    dataset_bytes = shards * per_shard * record
    samples = shards * per_shard
    print(f"link: wanem rtt {link['rtt_ms']:g} ms, rate {link['rate_mbit']:g} Mbit/s, window "
          f"{link['window_kib']} KiB per connection; dataset {dataset_bytes / S.MiB:.0f} MiB of incompressible "
          f"{record // 1024} KiB records in 4 MiB chunks; every node reads all of it; N = {sizes}")
    b.records_dataset("recs", shards, per_shard, record, kind="random")
    per_n = {}
    for n in sizes:
        g = one_run(b, f"g{n}", n, link, "recs", dataset_bytes, samples, group=True)
        # N = 1: a group of one is a node on its own; the independent run is measured all the same.
        ind = one_run(b, f"i{n}", n, link, "recs", dataset_bytes, samples, group=False)
        per_n[str(n)] = {
            "origin_bytes_over_dataset": round(g["origin_bytes"] / dataset_bytes, 3),
            "origin_bytes_over_dataset_independent": round(ind["origin_bytes"] / dataset_bytes, 3),
            "node_goodput_mbit": round(g["node_goodput_mbit"], 1),
            "node_goodput_mbit_independent": round(ind["node_goodput_mbit"], 1),
            "wall_s": round(g["wall_s"], 2),
            "wall_s_independent": round(ind["wall_s"], 2),
            "wall_over_independent": round(g["wall_s"] / ind["wall_s"], 3),
        }
        print(f"  N={n}: wall group/independent {per_n[str(n)]['wall_over_independent']:.2f}")
    top = per_n[str(sizes[-1])]
    return {
        "origin_bytes_over_dataset": top["origin_bytes_over_dataset"],
        "node_goodput_mbit": top["node_goodput_mbit"],
        "wall_over_independent": top["wall_over_independent"],
        "nodes": sizes[-1],
        "link_mbit": link["rate_mbit"],
        "rtt_ms": link["rtt_ms"],
        "window_kib": link["window_kib"],
        "dataset_bytes": dataset_bytes,
        "per_n": per_n,
    }


if __name__ == "__main__":
    S.main(body)
