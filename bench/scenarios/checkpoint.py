#!/usr/bin/python3
"""bench/run checkpoint [--quick] [--rtt-ms 30] [--rate-mbit 1000] [--window-kib 512] [--size-mib 1024]

Checkpoint write-behind: what a trainer waits for when it saves a checkpoint, through shardcache
vs straight to the remote city, over the same long link.

  origin shardcached ([checkpoints] root, a writer token) ← wanem (the link) ← node shardcached
  ← the trainer (Python client: client.checkpoint(name) as a file; writes SIZE random bytes).

  save_s        trainer-visible save time through shardcache: open → close returned (the bytes
                are durable on the node's disk);
  upload_s      from the save's start until the origin committed it (client.wait_uploaded);
  direct_s      the same bytes written straight to the remote: one TCP stream through an
                identical wanem to a receiver that writes and fsyncs them and then answers (a
                trainer writing to remote storage itself);
  save_speedup  direct_s / save_s (target >= 10 for 1 GiB);
  upload_over_link  size / (upload_s - save_s) / link rate: the background upload's share of
                the link.

Exit status: 0 measured, 1 could not measure, 2 wanem.py absent."""
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _serving as S  # noqa: E402
from cold import parse_link, require_wanem, start_wanem  # noqa: E402

sys.path.insert(0, os.path.join(S.BUILD, "python"))

NAME = "bench/step1/rank0.pt"


def receiver(path):
    """A remote receiver: one connection, 8-byte length then the bytes; writes, fsyncs, answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn, open(path, "wb") as f:
            want = int.from_bytes(conn.recv(8, socket.MSG_WAITALL), "little")
            got = 0
            while got < want:
                block = conn.recv(min(4 << 20, want - got))
                if not block:
                    return
                f.write(block)
                got += len(block)
            f.flush()
            os.fsync(f.fileno())
            conn.sendall(b"k")
    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


def direct_write(b, link, data):
    port = receiver(b.path("direct.out"))
    wport, _ = start_wanem(b, "direct-wanem", port, link)
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", wport)) as s:
        s.sendall(len(data).to_bytes(8, "little"))
        view = memoryview(data)
        for i in range(0, len(data), 4 << 20):
            s.sendall(view[i:i + (4 << 20)])
        if s.recv(1) != b"k":
            raise S.CannotMeasure("the direct receiver did not confirm the write")
    return time.perf_counter() - t0


def shardcache_save(b, link, data):
    import shardcache
    token = b.path("writer.token")
    with open(token, "w") as f:
        f.write("bench-writer\n")
    oport = S.free_port()
    origin = b.daemon("origin", "file://" + b.path("data"), origin_port=oport,
                      extra=f'[checkpoints]\nroot = "{b.path("remote")}"\nwriters = ["bench/={token}"]\n')
    wport, _ = start_wanem(b, "wanem", oport, link)
    sock = b.path("node.sock")
    b.daemon("node", f"grpc://127.0.0.1:{wport}", socket_path=sock, cache_size=256 * S.MiB,
             extra=f'[auth]\ntoken_file = "{token}"\n')
    client = shardcache.Client(sock)
    t0 = time.perf_counter()
    with client.checkpoint(NAME) as f:
        view = memoryview(data)
        for i in range(0, len(data), 4 << 20):
            f.write(view[i:i + (4 << 20)])
    save_s = time.perf_counter() - t0
    client.wait_uploaded(NAME, timeout=3600)
    upload_s = time.perf_counter() - t0
    sent = origin.metric("shardcache_checkpoint_received_bytes_total")
    if os.path.getsize(os.path.join(b.path("remote"), NAME)) != len(data):
        raise S.CannotMeasure("the origin's copy has the wrong size")
    return save_s, upload_s, sent


def parse(argv):
    link, rest = parse_link(argv)
    size_mib = 1024
    it = iter(rest)
    for a in it:
        if a == "--size-mib":
            size_mib = int(next(it))
        else:
            raise S.CannotMeasure(f"unknown option {a}")
    return link, size_mib


def body(quick, argv):
    link, size_mib = parse(argv)
    if quick:
        size_mib = min(size_mib, 128)
    require_wanem()
    S.need("shardcached", "shardctl", "sc_datagen")
    b = S.Bench("checkpoint")
    b.records_dataset("recs", 1, 16, 4096)  # the origin serves a dataset too; not read here
    data = os.urandom(size_mib * S.MiB)
    print(f"link: wanem rtt {link['rtt_ms']:g} ms, rate {link['rate_mbit']:g} Mbit/s, window "
          f"{link['window_kib']} KiB per connection; checkpoint {size_mib} MiB of random bytes")
    save_s, upload_s, sent = shardcache_save(b, link, data)
    print(f"  through shardcache: save returned in {save_s:.2f} s (durable on the node), committed upstream "
          f"after {upload_s:.2f} s; origin received {sent / S.MiB:.0f} MiB")
    direct_s = direct_write(b, link, data)
    print(f"  straight to the remote (one stream): {direct_s:.2f} s")
    link_bytes_s = link["rate_mbit"] * 1e6 / 8
    background = max(upload_s - save_s, 1e-3)
    return {
        "save_speedup": round(direct_s / save_s, 2),
        "upload_over_link": round(len(data) / background / link_bytes_s, 3),
        "save_s": round(save_s, 3),
        "upload_s": round(upload_s, 2),
        "direct_s": round(direct_s, 2),
        "size_bytes": len(data),
        "link_mbit": link["rate_mbit"],
        "rtt_ms": link["rtt_ms"],
        "window_kib": link["window_kib"],
    }


if __name__ == "__main__":
    S.main(body)
