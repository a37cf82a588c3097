"""Checkpoint write-behind end to end: trainers save through a node shardcached (grpc upstream),
which uploads to an origin shardcached that takes checkpoints under [checkpoints] root. Both are
real daemons (build/bin/shardcached) started here; the origin serves the test dataset too."""
import hashlib
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

import shardcache

from conftest import BIN

NAME = "run7/step1000/rank3.pt"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, tmp, tag):
        self.metrics_port = _free_port()
        self.path = tmp / (tag + ".toml")
        self.log = tmp / (tag + ".log")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([os.path.join(BIN, "shardcached"), "--config", str(self.path)],
                                     stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/ready" % self.metrics_port, timeout=1)
                return self
            except Exception:
                assert self.proc.poll() is None, self.log.read_text()[-3000:]
                time.sleep(0.1)
        raise AssertionError("shardcached did not become ready:\n" + self.log.read_text()[-3000:])

    def metric(self, name):
        body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port, timeout=5).read().decode()
        return sum(float(l.split()[-1]) for l in body.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path, data_root):
    """(origin, node, socket, remote root): origin takes run7/ from the token the node sends."""
    token = tmp_path / "run7.token"
    token.write_text("secret-run7\n")
    os.chmod(token, 0o600)
    origin_port = _free_port()
    origin = Daemon(tmp_path, "origin")
    origin.path.write_text(f'''upstream = "file://{data_root}"
[listen]
origin = "127.0.0.1:{origin_port}"
socket = ""
metrics = "127.0.0.1:{origin.metrics_port}"
[cache]
size = "0"
memory_size = "0"
[checkpoints]
root = "{tmp_path}/remote"
writers = ["run7/={token}"]
''')
    sock = tmp_path / "node.sock"
    node = Daemon(tmp_path, "node")
    node.config = lambda bandwidth, staging="staging": node.path.write_text(f'''upstream = "grpc://127.0.0.1:{origin_port}"
[listen]
origin = ""
socket = "{sock}"
metrics = "127.0.0.1:{node.metrics_port}"
[cache]
dir = "{tmp_path}/node-cache"
size = "256MiB"
segment_size = "16MiB"
memory_size = "0"
min_free = "0"
[auth]
token_file = "{token}"
[checkpoints]
dir = "{tmp_path}/{staging}"
upload_bandwidth = "{bandwidth}"
[local]
allowed_groups = []
''')
    node.config("48MiB")  # 64 MiB take more than a second to upload
    origin.start()
    node.start()
    yield origin, node, str(sock), tmp_path / "remote"
    node.stop()
    origin.stop()


def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _wait_received(origin, nbytes):
    """Until the origin has taken `nbytes` of checkpoint parts (the upload is under way)."""
    deadline = time.time() + 30
    while origin.metric("shardcache_checkpoint_received_bytes_total") < nbytes:
        assert time.time() < deadline
        time.sleep(0.05)


def _save(client, name, data):
    t0 = time.perf_counter()
    with client.checkpoint(name) as f:
        for i in range(0, len(data), 1 << 20):
            f.write(data[i:i + (1 << 20)])
    return time.perf_counter() - t0


def test_a_save_returns_once_local_and_the_origin_copy_appears_later_whole(cluster):
    origin, node, sock, remote = cluster
    client = shardcache.Client(sock)
    data = os.urandom(64 << 20)
    took = _save(client, NAME, data)
    assert not (remote / NAME).exists()  # the upload runs behind the save
    [state] = client.checkpoints(NAME)
    assert state["state"] in ("local", "uploading") and state["size"] == len(data) and state["local"]
    client.wait_uploaded(NAME, timeout=120)
    assert (remote / NAME).read_bytes() == data
    assert client.checkpoints(NAME)[0]["state"] == "remote"
    with client.open_checkpoint(NAME) as f:
        assert f.read() == data
    out = subprocess.run([os.path.join(BIN, "shardctl"), "checkpoints", "--socket", sock],
                         stdout=subprocess.PIPE, text=True, check=True).stdout
    assert NAME in out and "remote" in out
    assert took < 30


def test_an_aborted_save_is_not_saved(cluster):
    _, _, sock, remote = cluster
    client = shardcache.Client(sock)
    with pytest.raises(RuntimeError):
        with client.checkpoint("run7/broken.pt") as f:
            f.write(b"half a checkpoint")
            raise RuntimeError("torch.save failed")
    with pytest.raises(shardcache.Error) as e:
        client.checkpoints("run7/broken.pt")
    assert e.value.code_name == "NotFound"


def test_kill_9_of_the_node_mid_upload_resumes_without_resending_verified_parts(cluster):
    origin, node, sock, remote = cluster
    client = shardcache.Client(sock, reconnect_timeout_ms=0)
    data = os.urandom(96 << 20)
    _save(client, NAME, data)
    _wait_received(origin, 40 << 20)
    node.kill9()
    assert not (remote / NAME).exists()
    node.config("0")
    node.start()
    client = shardcache.Client(sock)
    client.wait_uploaded(NAME, timeout=120)
    assert _digest(remote / NAME) == hashlib.sha256(data).hexdigest()
    received = origin.metric("shardcache_checkpoint_received_bytes_total")
    # Parts verified before the kill are not sent again; parts in flight then (8 x 4 MiB) may be.
    assert received <= len(data) + (32 << 20), received


def test_kill_9_of_the_origin_mid_upload_leaves_no_file_under_the_final_name(cluster):
    origin, node, sock, remote = cluster
    client = shardcache.Client(sock)
    data = os.urandom(64 << 20)
    _save(client, NAME, data)
    _wait_received(origin, 16 << 20)
    origin.kill9()
    assert not (remote / NAME).exists()
    assert [p.name for p in (remote / "run7" / "step1000").iterdir() if not p.name.startswith(".")] == []
    origin.start()  # the node retries; the upload resumes and completes
    client.wait_uploaded(NAME, timeout=120)
    assert (remote / NAME).read_bytes() == data


def test_a_name_outside_the_token_prefix_fails_with_the_reason_and_stays_local(cluster):
    _, _, sock, remote = cluster
    client = shardcache.Client(sock)
    _save(client, "run8/step1/rank0.pt", b"x" * 1000)
    with pytest.raises(shardcache.Error) as e:
        client.wait_uploaded("run8/step1/rank0.pt", timeout=30)
    assert "PermissionDenied" in str(e.value) or "PERMISSION_DENIED" in str(e.value)
    [state] = client.checkpoints("run8/step1/rank0.pt")
    assert state["state"] == "failed" and state["local"]
    assert not (remote / "run8").exists()


def test_torch_save_of_1_gib_returns_after_the_local_write(cluster):
    torch = pytest.importorskip("torch")
    _, node, sock, remote = cluster
    client = shardcache.Client(sock)
    tensor = torch.randint(0, 255, (1 << 30,), dtype=torch.uint8)
    t0 = time.perf_counter()
    with client.checkpoint(NAME) as f:
        torch.save({"weights": tensor}, f)
    took = time.perf_counter() - t0
    assert not (remote / NAME).exists()  # 1 GiB at 48 MiB/s: the upload takes ~20 s more
    client.wait_uploaded(NAME, timeout=300)
    back = torch.load(str(remote / NAME))
    assert torch.equal(back["weights"], tensor)
    print("torch.save of 1 GiB through shardcache: %.2f s" % took)


def test_a_full_disk_on_the_node_is_an_error_to_the_trainer_not_a_saved_checkpoint(cluster, tmp_path):
    _, node, sock, remote = cluster
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)],
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        node.stop()
        node.config("0", staging="small")
        node.start()
        client = shardcache.Client(sock)
        with pytest.raises(OSError) as e:
            with client.checkpoint("run7/big.pt") as f:
                f.write(os.urandom(16 << 20))
        assert e.value.errno == 28  # ENOSPC
        with pytest.raises(shardcache.Error):
            client.checkpoints("run7/big.pt")  # never reported saved
        _save(client, "run7/small.pt", b"s" * (1 << 20))  # the space came back with the abort
        client.wait_uploaded("run7/small.pt", timeout=60)
        assert (remote / "run7/small.pt").read_bytes() == b"s" * (1 << 20)
    finally:
        node.stop()
        subprocess.run(["umount", "-l", str(small)])
