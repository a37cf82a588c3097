"""Fixtures: a records dataset written by sc_datagen and indexed by shardctl, served by a
minimal node daemon (tests/serve/local_serve_helper: FileSource + LocalService) on a socket in a
temporary directory."""
import os
import subprocess
import time

import pytest

BUILD = os.environ.get("SHARDCACHE_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build"))
BIN = os.path.join(BUILD, "bin")

RECORD_BYTES = 256
SHARDS = 4
RECORDS_PER_SHARD = 200


def _run(*args):
    subprocess.run([str(a) for a in args], check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    ds = root / "tokens-v3"
    _run(os.path.join(BIN, "sc_datagen"), "records", ds, "--shards", SHARDS,
         "--records-per-shard", RECORDS_PER_SHARD, "--record-bytes", RECORD_BYTES)
    _run(os.path.join(BIN, "shardctl"), "index", ds, "--format", "records",
         "--record-bytes", RECORD_BYTES, "--chunk-bytes", 16384)
    return root


@pytest.fixture(scope="session")
def expected(data_root):
    """Global sample id -> bytes, read straight from the shard files (manifest order = sorted)."""
    shards = sorted(p for p in (data_root / "tokens-v3").iterdir() if p.is_file())
    out = []
    for p in shards:
        data = p.read_bytes()
        out += [data[i:i + RECORD_BYTES] for i in range(0, len(data), RECORD_BYTES)]
    assert len(out) == SHARDS * RECORDS_PER_SHARD
    return out


@pytest.fixture(scope="session")
def socket_path(data_root, tmp_path_factory):
    sock = tmp_path_factory.mktemp("run") / "shardcached.sock"
    proc = subprocess.Popen([os.path.join(BIN, "local_serve_helper"), str(data_root), str(sock),
                             str(16 << 20), "16"], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    yield str(sock)
    proc.terminate()
    proc.wait(timeout=20)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long tests, run by make test-slow")
    # A normal run raises no UserWarning (torch's own advice about more DataLoader workers than
    # this 2-core machine's CPUs is not ours).
    config.addinivalue_line("filterwarnings", "error::UserWarning")
    config.addinivalue_line("filterwarnings", "ignore:This DataLoader will create:UserWarning")
