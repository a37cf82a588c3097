#!/usr/bin/python3
"""bench/run fetch [--quick] [--runs N] [--origin auto|daemon|dev]

`shardctl fetch` of one incompressible shard (256 MiB; 64 MiB with --quick) from an Origin
service on loopback, next to `curl` downloading the same file from nginx on loopback, in the
same run, alternating, from a warm page cache. Both write the bytes to a file in the work
directory. Reports the median of N runs each; the last line is JSON:
  {"fetch_mbit", "curl_mbit", "fetch_over_curl", "bytes", "wire_bytes", ...}

The origin is build/bin/shardcached with a file upstream when it is built (--origin daemon),
else the development server sc_origin_dev_server (--origin dev); `auto` picks the first that
exists."""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _serving import BIN, MiB, Bench, CannotMeasure, free_port, main, need  # noqa: E402


def wait_port(port, proc, what, timeout=30):
    import socket
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise CannotMeasure(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise CannotMeasure(f"{what} did not listen on port {port}")


def start_origin(b, kind, root):
    port = free_port()
    if kind == "auto":
        kind = "daemon" if os.access(os.path.join(BIN, "shardcached"), os.X_OK) else "dev"
    if kind == "daemon":
        need("shardcached")
        b.daemon("origin", "file://" + root, origin_port=port, cache_size=0, memory_size=0)
        return port, "shardcached (file upstream)"
    need("sc_origin_dev_server")
    log = open(b.path("origin.log"), "w")
    p = subprocess.Popen([os.path.join(BIN, "sc_origin_dev_server"), "--root", root,
                          "--listen", f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    b.procs.append(p)
    wait_port(port, p, "sc_origin_dev_server")
    return port, "sc_origin_dev_server"


def start_nginx(b, root):
    port = free_port()
    prefix = b.path("nginx")
    os.makedirs(os.path.join(prefix, "logs"), exist_ok=True)
    conf = os.path.join(prefix, "nginx.conf")
    # Started as root, nginx workers drop to "nobody", who cannot read the 0700 work dir.
    user = "user root;\n" if os.geteuid() == 0 else ""
    with open(conf, "w") as f:
        f.write(f"""daemon off;
{user}worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 64; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  server {{
    listen 127.0.0.1:{port};
    root {root};
  }}
}}
""")
    log = open(b.path("nginx.log"), "w")
    p = subprocess.Popen(["nginx", "-p", prefix, "-c", conf], stdout=log, stderr=subprocess.STDOUT)
    b.procs.append(p)
    wait_port(port, p, "nginx")
    return port


def body(quick, argv):
    runs = 3
    origin_kind = "auto"
    i = 0
    while i < len(argv):
        if argv[i] == "--runs":
            runs = int(argv[i + 1]); i += 2
        elif argv[i] == "--origin":
            origin_kind = argv[i + 1]; i += 2
        else:
            raise CannotMeasure(f"unknown option {argv[i]}")
    need("sc_datagen", "shardctl")
    if subprocess.run(["which", "nginx"], stdout=subprocess.DEVNULL).returncode != 0:
        raise CannotMeasure("nginx is not installed (deploy/setup.sh)")
    b = Bench("fetch")
    shard_bytes = (64 if quick else 256) * MiB
    record_bytes = 4096
    d = b.records_dataset("incompressible", 1, shard_bytes // record_bytes, record_bytes)
    root = os.path.dirname(d)
    shard_rel = sorted(f for f in os.listdir(d) if not f.startswith("."))[0]
    shard_path = os.path.join(d, shard_rel)
    assert os.path.getsize(shard_path) == shard_bytes
    subprocess.run(["cat", shard_path], stdout=subprocess.DEVNULL, check=True)  # warm page cache

    origin_port, origin_desc = start_origin(b, origin_kind, root)
    nginx_port = start_nginx(b, root)
    out = b.path("out.bin")
    fetch_mbit, curl_mbit, wire = [], [], []
    print(f"shard: {shard_bytes // MiB} MiB incompressible records, 4 MiB chunks; origin: {origin_desc} "
          f"on 127.0.0.1:{origin_port}; nginx 127.0.0.1:{nginx_port}; {runs} runs each, alternating")
    for r in range(runs):
        t = subprocess.run([os.path.join(BIN, "shardctl"), "fetch", "--upstream",
                            f"grpc://127.0.0.1:{origin_port}", "--json", "incompressible", "0", out],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if t.returncode != 0:
            raise CannotMeasure(f"shardctl fetch failed:\n{t.stdout[-2000:]}")
        import json
        fig = json.loads(t.stdout.strip().splitlines()[-1])
        if r == 0 and subprocess.run(["cmp", "-s", out, shard_path]).returncode != 0:
            raise CannotMeasure("shardctl fetch wrote bytes that differ from the shard")
        os.unlink(out)
        fetch_mbit.append(fig["mbit"])
        wire.append(fig["wire_bytes"])
        c = subprocess.run(["curl", "-s", "-f", "-o", out, "-w", "%{size_download} %{time_total}",
                            f"http://127.0.0.1:{nginx_port}/{os.path.basename(d)}/{shard_rel}"],
                           stdout=subprocess.PIPE, text=True)
        if c.returncode != 0:
            raise CannotMeasure(f"curl failed with {c.returncode}")
        size, secs = c.stdout.split()
        if int(size) != shard_bytes:
            raise CannotMeasure(f"curl got {size} bytes, expected {shard_bytes}")
        os.unlink(out)
        curl_mbit.append(int(size) * 8 / float(secs) / 1e6)
        print(f"  run {r + 1}: shardctl fetch {fig['mbit']:8.0f} Mbit/s ({fig['seconds']:.3f} s, "
              f"wire {fig['wire_bytes'] / MiB:.1f} MiB, stream limit {fig['stream_limit']})   "
              f"curl {curl_mbit[-1]:8.0f} Mbit/s ({float(secs):.3f} s)")
    f_med, c_med = statistics.median(fetch_mbit), statistics.median(curl_mbit)
    print(f"median: shardctl fetch {f_med:.0f} Mbit/s, curl {c_med:.0f} Mbit/s, "
          f"fetch/curl = {f_med / c_med:.2f} (every chunk hash-verified on the fetch side; "
          f"curl checks nothing)")
    return {"fetch_mbit": round(f_med, 1), "curl_mbit": round(c_med, 1),
            "fetch_over_curl": round(f_med / c_med, 3), "bytes": shard_bytes,
            "wire_bytes": int(statistics.median(wire)), "runs": runs, "origin": origin_desc}


if __name__ == "__main__":
    main(body)
