"""Shared plumbing of the serving benchmarks (hit, amplification, concurrency, latency):
temporary work directory, datasets (sc_datagen + shardctl index), daemons (shardcached with a
generated TOML), the trainer stand-in (sc_trainer_bench), Prometheus scraping, and cleanup of
every process and file also on failure or Ctrl-C.

Not a scenario itself (not executable, so bench/run does not list it)."""
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SOURCE = os.environ.get("SHARDCACHE_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
BUILD = os.environ.get("SHARDCACHE_BUILD_DIR", os.path.join(SOURCE, "build"))
BIN = os.path.join(BUILD, "bin")
MiB = 1 << 20


class CannotMeasure(Exception):
    pass


def need(*names):
    for n in names:
        if not os.access(os.path.join(BIN, n), os.X_OK):
            raise CannotMeasure(f"{os.path.join(BIN, n)} is not built (make build)")


class Bench:
    def __init__(self, name):
        self.name = name
        # On the disk, not tmpfs: O_DIRECT readers and the NVMe tier need a real file system.
        base = "/var/tmp" if os.path.isdir("/var/tmp") else None
        self.work = tempfile.mkdtemp(prefix=f"shardcache-bench-{name}-", dir=base)
        self.procs = []
        atexit.register(self.cleanup)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        self.cleanup()
        sys.exit(128 + signum)

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.time() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        if os.environ.get("SHARDCACHE_BENCH_KEEP"):  # logs and configs, for a look afterwards
            print(f"kept {self.work}", file=sys.stderr)
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def run(self, *args, **kw):
        r = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, **kw)
        if r.returncode != 0:
            raise CannotMeasure(f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout[-2000:]}")
        return r.stdout

    def records_dataset(self, name, shards, records_per_shard, record_bytes, chunk_bytes=4 * MiB,
                        kind="random"):
        d = self.path("data", name)
        self.run(os.path.join(BIN, "sc_datagen"), "records", d, "--shards", shards,
                 "--records-per-shard", records_per_shard, "--record-bytes", record_bytes,
                 "--kind", kind)
        self.run(os.path.join(BIN, "shardctl"), "index", d, "--format", "records",
                 "--record-bytes", record_bytes, "--chunk-bytes", chunk_bytes)
        return d

    def daemon(self, name, upstream, socket_path="", origin_port=0, cache_size=0, memory_size=0,
               eviction="lru", segment_size=64 * MiB, prefetch=256 * MiB, arena=512 * MiB, slots=16,
               extra=""):
        metrics_port = free_port()
        cache_dir = self.path(name + "-cache")
        os.makedirs(cache_dir, exist_ok=True)
        cfg = self.path(name + ".toml")
        with open(cfg, "w") as f:
            f.write(f"""upstream = "{upstream}"
[listen]
origin = "{'127.0.0.1:%d' % origin_port if origin_port else ''}"
socket = "{socket_path}"
metrics = "127.0.0.1:{metrics_port}"
[cache]
dir = "{cache_dir}"
size = "{cache_size}"
memory_size = "{memory_size}"
eviction = "{eviction}"
segment_size = "{segment_size}"
min_free = "1%"
[fetch]
prefetch = "{prefetch}"
[local]
arena_size = "{arena}"
slots = {slots}
[log]
level = "{os.environ.get('SHARDCACHE_BENCH_LOG_LEVEL', 'warn')}"
{extra}
""")
        log = open(self.path(name + ".log"), "w")
        p = subprocess.Popen([os.path.join(BIN, "shardcached"), "--config", cfg], stdout=log,
                             stderr=subprocess.STDOUT)
        self.procs.append(p)
        d = Daemon(p, metrics_port, socket_path, cache_dir, self.path(name + ".log"))
        d.wait_ready()
        return d

    def trainer(self, socket_path, dataset, **kw):
        """Starts sc_trainer_bench; returns the Popen (stdout: one JSON line per epoch)."""
        args = [os.path.join(BIN, "sc_trainer_bench"), "--socket", socket_path, "--dataset", dataset]
        for k, v in kw.items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                args.append(flag)
            elif v is not False and v is not None:
                args += [flag, str(v)]
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def trainer_epochs(self, socket_path, dataset, **kw):
        p = self.trainer(socket_path, dataset, **kw)
        out, err = p.communicate()
        if p.returncode != 0:
            raise CannotMeasure(f"sc_trainer_bench failed: {err.strip()}")
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


class Daemon:
    def __init__(self, proc, metrics_port, socket_path, cache_dir, log):
        self.proc = proc
        self.metrics_port = metrics_port
        self.socket = socket_path
        self.cache_dir = cache_dir
        self.log = log

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise CannotMeasure(f"shardcached exited ({self.proc.returncode}); log:\n" +
                                    open(self.log).read()[-2000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/ready", timeout=1) as r:
                    if r.status == 200 and (not self.socket or os.path.exists(self.socket)):
                        return
            except Exception:
                pass
            time.sleep(0.05)
        raise CannotMeasure("shardcached did not become ready in time")

    def metrics(self):
        """{name or name{labels}: value} from /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
        return out

    def wait_no_clients(self, timeout=30):
        """Waits until the daemon has torn down every client connection (loaders stopped, arenas
        unmapped): a measured trainer then does not share the CPUs with the last one's teardown."""
        deadline = time.time() + timeout
        while self.metric("shardcache_serve_connections", 1.0) > 0:
            if time.time() > deadline:
                raise CannotMeasure("shardcached still counts client connections after the trainers exited")
            time.sleep(0.05)

    def metric(self, name, default=0.0):
        return self.metrics().get(name, default)

    def cpu_seconds(self):
        return cpu_seconds(self.proc.pid)

    def drop_page_cache_of(self, path):
        drop_page_cache(path)


def cpu_seconds(pid):
    """CPU time (user + system, seconds) a running process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick  # utime + stime


def drop_page_cache(path):
    """Evicts a directory tree's files from the page cache (POSIX_FADV_DONTNEED)."""
    for root, _, files in os.walk(path):
        for f in files:
            try:
                fd = os.open(os.path.join(root, f), os.O_RDONLY)
                try:
                    os.fsync(fd)
                except OSError:
                    pass
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            except OSError:
                pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main(body):
    """Runs body(quick, argv) → dict of figures; prints the JSON last line; exit 1 when it
    cannot measure."""
    quick = "--quick" in sys.argv[1:]
    argv = [a for a in sys.argv[1:] if a != "--quick"]
    try:
        figures = body(quick, argv)
    except CannotMeasure as e:
        print(f"cannot measure: {e}", file=sys.stderr)
        print(json.dumps({"error": str(e).splitlines()[0]}))
        sys.exit(1)
    print(json.dumps(figures))
