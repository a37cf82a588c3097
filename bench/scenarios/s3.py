#!/usr/bin/python3
"""bench/run s3 [--quick] [--rtt-ms 30] [--rate-mbit 1000] [--window-kib 512] [--shuffle global]

Cold epoch from a bucket over a modelled long-distance link: s3rver (the S3-protocol server of
the objstore tests) on loopback with bucket `bench` → wanem (/work/shared/tools/wanem.py, or
$SHARDCACHE_WANEM) → node shardcached with `upstream = "s3://bench/datasets"` (path-style,
[objstore] endpoint = the wanem port) and an empty cache → one sc_trainer_bench client reads
one epoch of a 1 GiB dataset of incompressible records (--quick: 64 MiB) through the node's
local socket. A second fresh node reads it in file order (shuffle none:
goodput_mbit_sequential, the upstream's own rate without the global shuffle's tail of cache
reads). The dataset is written by sc_datagen, indexed by `shardctl index` on disk and uploaded
as is (shards + .shardcache/ index objects) by `rclone copy`, straight to s3rver.

Peers in the same run copy the same objects (the whole dataset prefix) from s3rver through a
wanem with the same settings into a local directory: `s3cmd get --recursive` (one connection,
one object at a time; stopped after 90 s, its rate is what it wrote by then), `rclone copy`
with a few --transfers / --multi-thread-streams settings (the best counts), and `aws s3 cp
--recursive` when an `aws` is on PATH (not a Debian package: skipped cleanly where absent; it
counts in best_peer, over_best_debian_peer leaves it out). References without wanem, to tell
whether s3rver itself (one Node.js process) limits a run on this machine: the node's epoch and
the best rclone setting reading s3rver directly (goodput_direct_mbit, rclone_direct_mbit).

goodput = dataset bytes delivered to the client ÷ wall time of the client process; a peer's
rate = bytes it copied ÷ its wall. link_mbit = the wanem rate; effective_over_link = goodput ÷
link; over_best_peer = goodput ÷ the best peer's rate.

Exit status: 0 measured, 1 could not measure, 2 a tool absent (wanem.py, s3rver, s3cmd, rclone)."""
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _serving as S  # noqa: E402
from cold import absent, parse_link, parse_shuffle, require_wanem, start_wanem, stop  # noqa: E402
from fetch import wait_port  # noqa: E402

BUCKET = "bench"
PREFIX = "datasets"
KEY = "S3RVER"  # s3rver's built-in access key (secret S3RVER); it checks the key id only
# rclone copy settings tried (transfers, multi-thread streams; cutoff 0 = rclone's default).
S3CMD_SECONDS = 90  # s3cmd copies one object at a time on one connection: its rate is what it wrote by then
RCLONE_SETTINGS = [(4, 4, 0), (16, 4, 0), (8, 4, 8), (16, 8, 8), (16, 16, 8)]


def clean_environment():
    """The AWS_* variables of this shell (a CA bundle, an endpoint, a profile) are not the
    bench's: every S3 client here gets its endpoint and credentials from the bench alone.
    (rclone 1.60 refuses to start at all with AWS_CA_BUNDLE set on a plain-http endpoint.)"""
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        del os.environ[k]


def start_s3rver(b):
    port = S.free_port()
    log = open(b.path("s3rver.log"), "w")
    env = dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider")  # s3rver's DES tokens
    p = subprocess.Popen(["s3rver", "-d", b.path("s3rver"), "-a", "127.0.0.1", "-p", str(port), "-s",
                          "--configure-bucket", BUCKET], stdout=log, stderr=subprocess.STDOUT, env=env)
    b.procs.append(p)
    try:
        wait_port(port, p, "s3rver")
    except S.CannotMeasure as e:
        raise S.CannotMeasure(f"{e}; log:\n{open(b.path('s3rver.log')).read()[-1500:]}")
    return port, p


def tool_configs(b):
    """rclone.conf and .s3cfg naming remote `s3` / the endpoint per port (written per run)."""
    def rclone(port):
        path = b.path(f"rclone-{port}.conf")
        with open(path, "w") as f:
            f.write(f"[s3]\ntype = s3\nprovider = Other\naccess_key_id = {KEY}\nsecret_access_key = {KEY}\n"
                    f"endpoint = http://127.0.0.1:{port}\nregion = us-east-1\nforce_path_style = true\n")
        return path

    def s3cmd(port):
        path = b.path(f"s3cfg-{port}")
        with open(path, "w") as f:
            f.write(f"[default]\naccess_key = {KEY}\nsecret_key = {KEY}\nhost_base = 127.0.0.1:{port}\n"
                    f"host_bucket = 127.0.0.1:{port}\nuse_https = False\nsignature_v2 = False\n"
                    "bucket_location = us-east-1\n")
        return path
    return rclone, s3cmd


def tree_bytes(d):
    total = 0
    for root, _, files in os.walk(d):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def upload(b, rclone_conf, data_root):
    t0 = time.perf_counter()
    b.run("rclone", "--config", rclone_conf, "copy", data_root, f"s3:{BUCKET}/{PREFIX}", "--transfers", "8",
          "--s3-upload-concurrency", "4")
    return time.perf_counter() - t0


def node_epoch(b, name, port, dataset, dataset_bytes, samples, shuffle, link=None):
    """Empty node reading s3://bench/datasets at 127.0.0.1:port; one client epoch."""
    sock = b.path(f"{name}.sock")
    objstore = (f"[objstore]\nendpoint = \"http://127.0.0.1:{port}\"\nregion = \"us-east-1\"\n"
                f"addressing = \"path\"\naccess_key_id = \"{KEY}\"\nsecret_access_key = \"{KEY}\"\n")
    node = b.daemon(name, f"s3://{BUCKET}/{PREFIX}", socket_path=sock,
                    cache_size=2 * dataset_bytes + 512 * S.MiB, memory_size=256 * S.MiB,
                    segment_size=256 * S.MiB, prefetch=256 * S.MiB, arena=512 * S.MiB, slots=16,
                    extra=objstore)
    m0 = node.metrics()
    done = threading.Event()
    trace = []
    t0 = time.perf_counter()
    sampler = threading.Thread(target=sample_objstore, args=(node, t0, done, trace), daemon=True)
    sampler.start()
    epochs = b.trainer_epochs(sock, dataset, batch_size=16, shuffle=shuffle, seed=7)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    m1 = node.metrics()
    stop(b, node.proc)
    if not epochs:
        raise S.CannotMeasure(f"{name}: sc_trainer_bench printed no epoch")
    e = epochs[-1]
    if e["samples"] != samples:
        raise S.CannotMeasure(f"{name}: client read {e['samples']} samples, dataset has {samples}")

    def delta(metric):
        return sum(v for k, v in m1.items() if k.split("{")[0] == metric) - \
            sum(v for k, v in m0.items() if k.split("{")[0] == metric)

    read = delta("shardcache_objstore_read_bytes_total")
    requests = delta("shardcache_objstore_requests_total")
    retries = delta("shardcache_objstore_retries_total")
    if read <= 0:
        raise S.CannotMeasure(f"{name}: node read no bytes from the bucket (cache not cold?)")
    goodput = e["bytes"] * 8 / wall / 1e6
    over = f" ({goodput / link['rate_mbit']:.2f} × link)" if link else ""
    print(f"  {name:16s}: {e['bytes'] / S.MiB:7.1f} MiB in {wall:6.2f} s = {goodput:7.1f} Mbit/s goodput{over}; "
          f"read from bucket {read / S.MiB:.1f} MiB in {requests:.0f} requests, {retries:.0f} retries, "
          f"client stall {e.get('stall_fraction', 0):.2f}, first batch {e.get('first_next_us', 0) / 1e3:.0f} ms")
    print_trace(name, trace)
    return {"goodput_mbit": goodput, "wall_s": wall, "read_bytes": int(read), "requests": int(requests),
            "retries": int(retries), "first_next_ms": e.get("first_next_us", 0) / 1e3}


def sample_objstore(node, t0, done, trace):
    """(seconds, bytes read from the bucket, bytes served to the client) every 0.25 s."""
    def total(m, metric):
        return sum(v for k, v in m.items() if k.split("{")[0] == metric)
    while not done.wait(0.25):
        try:
            m = node.metrics()
        except OSError:
            continue
        trace.append((time.perf_counter() - t0, total(m, "shardcache_objstore_read_bytes_total"),
                      total(m, "shardcache_serve_bytes_total")))


def print_trace(name, trace):
    """Bucket read rate (Mbit/s) and the share of the epoch served so far, per tenth of the run."""
    if len(trace) < 2:
        return
    step = max(1, len(trace) // 10)
    points = trace[::step] + ([trace[-1]] if (len(trace) - 1) % step else [])
    read = [f"{t_b:.1f}s: {(b_b - b_a) * 8 / (t_b - t_a) / 1e6:.0f}"
            for (t_a, b_a, _), (t_b, b_b, _) in zip(points, points[1:])]
    print(f"  {name} bucket reads (t: Mbit/s): " + ", ".join(read))
    served = [f"{t:.1f}s: {s / S.MiB:.0f}" for t, _, s in points]
    print(f"  {name} served to the client (t: MiB): " + ", ".join(served))


class Peers:
    """S3 copy tools copying s3://bench/datasets/DATASET/ into a local directory."""

    def __init__(self, b, dataset, total):
        self.b, self.dataset, self.total = b, dataset, total
        self.rclone_conf, self.s3cfg = tool_configs(b)
        self.out = b.path("peer-out")
        self.aws = shutil.which("aws") and subprocess.run(
            ["aws", "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0

    def _timed(self, what, args, env=None, max_s=None):
        """Runs a copy; its rate = bytes in the output directory ÷ wall. With max_s, a copy
        still running then is stopped and the bytes it wrote so far count (a one-connection
        tool on a narrow window would take most of an hour for the whole dataset)."""
        shutil.rmtree(self.out, ignore_errors=True)
        os.makedirs(self.out)
        log = open(self.b.path("peer.log"), "w+")
        t0 = time.perf_counter()
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.b.procs.append(p)
        capped = False
        try:
            p.wait(timeout=max_s)
        except subprocess.TimeoutExpired:
            capped = True
            stop(self.b, p)
        wall = time.perf_counter() - t0
        if p in self.b.procs:
            self.b.procs.remove(p)
        log.seek(0)
        if not capped and p.returncode != 0:
            raise S.CannotMeasure(f"{what} failed ({p.returncode}): {log.read()[-1500:]}")
        got = tree_bytes(self.out)
        shutil.rmtree(self.out, ignore_errors=True)
        if capped and got <= 0:
            raise S.CannotMeasure(f"{what} copied nothing in {max_s} s")
        if not capped and got != self.total:
            raise S.CannotMeasure(f"{what} copied {got} bytes, the dataset's objects hold {self.total}")
        mbit = got * 8 / wall / 1e6
        note = f" (stopped after {max_s} s)" if capped else ""
        print(f"  {what}: {got / S.MiB:.1f} MiB in {wall:.2f} s = {mbit:.1f} Mbit/s{note}")
        return mbit

    def src(self):
        return f"{BUCKET}/{PREFIX}/{self.dataset}"

    def s3cmd(self, port):
        return self._timed("s3cmd get --recursive", ["s3cmd", "-c", self.s3cfg(port), "--no-progress", "-q", "get",
                                                    "--recursive", f"s3://{self.src()}/", self.out + "/"],
                           max_s=S3CMD_SECONDS)

    def rclone(self, port, transfers, streams, cutoff_mib):
        args = ["rclone", "--config", self.rclone_conf(port), "copy", f"s3:{self.src()}", self.out,
                "--transfers", str(transfers), "--multi-thread-streams", str(streams)]
        what = f"rclone copy --transfers {transfers} --multi-thread-streams {streams}"
        if cutoff_mib:
            args += ["--multi-thread-cutoff", f"{cutoff_mib}M"]
            what += f" --multi-thread-cutoff {cutoff_mib}M"
        return self._timed(what, args)

    def aws_cp(self, port, concurrency):
        cfg = self.b.path("aws-config")
        with open(cfg, "w") as f:
            f.write(f"[default]\nregion = us-east-1\ns3 =\n  max_concurrent_requests = {concurrency}\n"
                    "  multipart_chunksize = 8MB\n  addressing_style = path\n")
        env = dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=KEY, AWS_CONFIG_FILE=cfg,
                   AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        return self._timed(f"aws s3 cp --recursive (max_concurrent_requests {concurrency})",
                           ["aws", "--endpoint-url", f"http://127.0.0.1:{port}", "s3", "cp", "--recursive",
                            "--only-show-errors", f"s3://{self.src()}/", self.out + "/"], env=env)


def body(quick, argv):
    link, rest = parse_link(argv)
    shuffle = parse_shuffle(rest)
    require_wanem()
    for tool in ("s3rver", "s3cmd", "rclone"):
        if shutil.which(tool) is None:
            absent(f"{tool} is not installed (deploy/setup.sh)")
    S.need("shardcached", "shardctl", "sc_datagen", "sc_trainer_bench")
    clean_environment()
    b = S.Bench("s3")
    record = 64 * 1024
    shards, per_shard = (4, 256) if quick else (8, 2048)  # 64 MiB quick, 1 GiB full
    dataset_bytes = shards * per_shard * record
    samples = shards * per_shard
    print(f"link: wanem rtt {link['rtt_ms']:g} ms, rate {link['rate_mbit']:g} Mbit/s, window "
          f"{link['window_kib']} KiB per connection; dataset {dataset_bytes / S.MiB:.0f} MiB ({shards} shards of "
          f"{per_shard} × {record // 1024} KiB incompressible records, 4 MiB chunks) in s3rver bucket '{BUCKET}', "
          f"shuffle {shuffle}, cold node cache")
    data = b.records_dataset("ds", shards, per_shard, record, kind="random")
    objects_bytes = tree_bytes(data)  # shards + manifest + sample indexes: what the peers copy
    s3port, _ = start_s3rver(b)
    peers = Peers(b, "ds", objects_bytes)
    up = upload(b, peers.rclone_conf(s3port), os.path.dirname(data))
    print(f"  uploaded {objects_bytes / S.MiB:.1f} MiB (shards + index objects) with rclone in {up:.1f} s "
          f"({objects_bytes * 8 / up / 1e6:.0f} Mbit/s, no wanem)")
    S.drop_page_cache(b.path("s3rver"))

    print("through wanem:")
    wport, wanem = start_wanem(b, "wanem-node", s3port, link)
    node = node_epoch(b, "node", wport, "ds", dataset_bytes, samples, shuffle, link)
    stop(b, wanem)
    sequential = None
    if shuffle != "none":
        # The same epoch in file order: under a global shuffle the client, having read every
        # chunk's first samples, reads most of the epoch from the cache after the last chunk
        # arrived; in file order it finishes with the last chunk (the upstream's own rate).
        wport, wanem = start_wanem(b, "wanem-node-none", s3port, link)
        sequential = node_epoch(b, "node-none", wport, "ds", dataset_bytes, samples, "none", link)
        stop(b, wanem)

    wport, wanem = start_wanem(b, "wanem-peers", s3port, link)
    figures = {"s3cmd": peers.s3cmd(wport)}
    rclone = {}
    for t, s, c in RCLONE_SETTINGS:
        rclone[(t, s, c)] = peers.rclone(wport, t, s, c)
    best_rclone = max(rclone, key=rclone.get)
    figures["rclone"] = rclone[best_rclone]
    if peers.aws:
        figures["aws"] = max(peers.aws_cp(wport, 10), peers.aws_cp(wport, 32))
    else:
        print("  aws: not on PATH (not a Debian package), skipped")
    stop(b, wanem)

    print("without wanem (s3rver's own limit on this machine):")
    node_direct = node_epoch(b, "node-direct", s3port, "ds", dataset_bytes, samples, shuffle)
    rclone_direct = peers.rclone(s3port, *best_rclone)

    best_peer = max(figures, key=figures.get)
    debian = {k: v for k, v in figures.items() if k in ("s3cmd", "rclone")}
    best_debian = max(debian, key=debian.get)
    goodput = node["goodput_mbit"]
    print(f"goodput {goodput:.1f} Mbit/s = {goodput / link['rate_mbit']:.2f} × link; best peer {best_peer} "
          f"{figures[best_peer]:.1f} Mbit/s (rclone best: --transfers {best_rclone[0]} --multi-thread-streams "
          f"{best_rclone[1]}{' --multi-thread-cutoff %dM' % best_rclone[2] if best_rclone[2] else ''}); "
          f"goodput/best peer: {goodput / figures[best_peer]:.2f}")
    if sequential:
        print(f"file order (shuffle none): {sequential['goodput_mbit']:.1f} Mbit/s = "
              f"{sequential['goodput_mbit'] / figures[best_peer]:.2f} × best peer")
    print(f"s3rver without wanem: node {node_direct['goodput_mbit']:.0f} Mbit/s, rclone {rclone_direct:.0f} Mbit/s "
          f"(link {link['rate_mbit']:g} Mbit/s)")
    out = {
        "goodput_mbit": round(goodput, 1),
        "link_mbit": link["rate_mbit"],
        "effective_over_link": round(goodput / link["rate_mbit"], 3),
    }
    for k, v in figures.items():
        out[f"{k}_mbit"] = round(v, 1)
    out.update({
        "best_peer": best_peer,
        "over_best_peer": round(goodput / figures[best_peer], 3),
        "over_best_debian_peer": round(goodput / debian[best_debian], 3),
        "rclone_best_transfers": best_rclone[0],
        "rclone_best_streams": best_rclone[1],
        "rclone_best_cutoff_mib": best_rclone[2],
        "goodput_mbit_sequential": round((sequential or node)["goodput_mbit"], 1),
        "goodput_direct_mbit": round(node_direct["goodput_mbit"], 1),
        "rclone_direct_mbit": round(rclone_direct, 1),
        "bucket_read_bytes": node["read_bytes"],
        "bucket_requests": node["requests"],
        "retries": node["retries"],
        "first_next_ms": round(node["first_next_ms"], 1),
        "upload_s": round(up, 2),
        "dataset_bytes": dataset_bytes,
        "objects_bytes": objects_bytes,
        "rtt_ms": link["rtt_ms"],
        "rate_mbit": link["rate_mbit"],
        "window_kib": link["window_kib"],
        "shuffle": shuffle,
    })
    return out


if __name__ == "__main__":
    S.main(body)
