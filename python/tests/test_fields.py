"""Samples by field: a WebDataset tar tree written by Python's tarfile the way webdataset's
ShardWriter writes it (keys with directories, pax headers for long and non-ASCII names), and a
Megatron dataset, read through the plain client and through shardcache.torch."""
import io
import json
import os
import subprocess
import tarfile

import numpy
import pytest

import shardcache

from conftest import BIN

SHARDS = 3
PER_SHARD = 40


def _key(s, k):
    # Directories in the key; every 7th sample has a long, non-ASCII directory (pax path header).
    if k % 7 == 3:
        return "train/class_%02d/%s/%06d" % (k % 10, "très-long-répertoire-" * 6, s * 1000 + k)
    return "train/class_%02d/%06d" % (k % 10, s * 1000 + k)


def _members(s, k):
    rng = numpy.random.default_rng(s * 1000 + k)
    return {
        "jpg": rng.integers(0, 256, int(rng.integers(100, 5000)), dtype=numpy.uint8).tobytes(),
        "cls": str(k % 10).encode(),
        "json": json.dumps({"shard": s, "k": k}).encode(),
    }


@pytest.fixture(scope="session")
def wds(data_root):
    """{key: {ext: bytes}} of the 'wds' dataset, written like webdataset.ShardWriter."""
    out = {}
    ds = data_root / "wds"
    ds.mkdir()
    for s in range(SHARDS):
        with tarfile.open(ds / ("shard-%06d.tar" % s), "w", format=tarfile.PAX_FORMAT) as tar:
            for k in range(PER_SHARD):
                key = _key(s, k)
                out[key] = _members(s, k)
                for ext, data in out[key].items():
                    info = tarfile.TarInfo(key + "." + ext)
                    info.size = len(data)
                    info.mode = 0o444
                    info.uname = info.gname = "bigdata"
                    info.mtime = 1700000000
                    tar.addfile(info, io.BytesIO(data))
    subprocess.run([os.path.join(BIN, "shardctl"), "index", str(ds), "--format", "tar", "--chunk-bytes", "65536"],
                   check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return out


@pytest.fixture(scope="session")
def megatron(data_root):
    ds = data_root / "gpt"
    subprocess.run([os.path.join(BIN, "sc_datagen"), "megatron", str(ds), "--shards", "2",
                    "--sequences-per-shard", "30", "--min-tokens", "5", "--max-tokens", "300"],
                   check=True, stdout=subprocess.PIPE)
    subprocess.run([os.path.join(BIN, "shardctl"), "index", str(ds), "--format", "megatron",
                    "--chunk-bytes", "16384"], check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return ds


def test_tar_samples_read_back_field_by_field_with_their_key(socket_path, wds):
    client = shardcache.Client(socket_path)
    loader = client.loader("wds", batch_size=16, shuffle="global", seed=3)
    assert loader.format == "tar"
    seen = set()
    for batch in loader:
        assert batch.has_fields
        for i, key in enumerate(batch.keys):
            sample = batch.fields(i)
            assert sample["__key__"] == key
            assert sample["__id__"] == batch.sample_ids[i]
            assert {k for k in sample if not k.startswith("__")} == {"jpg", "cls", "json"}
            for ext, data in wds[key].items():
                assert isinstance(sample[ext], memoryview) and bytes(sample[ext]) == data
            seen.add(key)
        # Columns: the same bytes, as offsets into the payload.
        payload = bytes(batch.data)
        names, table = batch.columns()
        assert sorted(names) == ["cls", "jpg", "json"] and table.shape == (7, len(batch))
        assert list(table[0]) == list(batch.sample_ids)
        for k, ext in enumerate(names):
            for i, key in enumerate(batch.keys):
                o, n = table[1 + 2 * k, i], table[2 + 2 * k, i]
                assert payload[o:o + n] == wds[key][ext]
    assert seen == set(wds)


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_tar_items_are_fields_as_views_and_decode_by_extension(socket_path, wds, workers):
    torch = pytest.importorskip("torch")
    from shardcache.torch import DataLoader, IterableDataset, Ragged
    ds = IterableDataset(socket_path, "wds", batch_size=16, shuffle="block", seed=1, decode="basic")
    keys = []
    for item in DataLoader(ds, num_workers=workers):
        assert isinstance(item["jpg"], Ragged)
        assert item["cls"].dtype == torch.int64  # "3" -> 3, stacked
        for i, key in enumerate(item["__key__"]):
            assert item["jpg"][i].numpy().tobytes() == wds[key]["jpg"]
            assert int(item["cls"][i]) == int(wds[key]["cls"])
            assert item["json"][i] == json.loads(wds[key]["json"])
        keys += item["__key__"]
    assert sorted(keys) == sorted(wds)


def test_torch_map_runs_per_sample_in_the_workers(socket_path, wds):
    pytest.importorskip("torch")
    from shardcache.torch import DataLoader, IterableDataset

    def lengths(sample):
        return {"key": sample["__key__"], "jpg_bytes": len(sample["jpg"])}

    ds = IterableDataset(socket_path, "wds", batch_size=10, map=lengths)
    got = {}
    for item in DataLoader(ds, num_workers=2):
        got.update(zip(item["key"], item["jpg_bytes"].tolist()))
    assert got == {k: len(v["jpg"]) for k, v in wds.items()}


def test_megatron_samples_come_in_the_index_dtype_with_their_length(socket_path, megatron):
    torch = pytest.importorskip("torch")
    from shardcache.torch import DataLoader, IterableDataset
    client = shardcache.Client(socket_path)
    loader = client.loader("gpt", batch_size=8)
    assert loader.sample_dtype == "uint16"
    expected = {}
    for b in loader:
        for i, sid in enumerate(b.sample_ids):
            expected[int(sid)] = numpy.frombuffer(b.sample(i), dtype=numpy.uint16).copy()
    assert len(expected) == 60
    n = 0
    for item in DataLoader(IterableDataset(socket_path, "gpt", batch_size=8), num_workers=2):
        for i, sid in enumerate(item["__id__"].tolist()):
            tokens = item["tokens"][i]
            assert tokens.dtype == torch.int32  # torch has no uint16: widened, values kept
            assert int(item["length"][i]) == len(expected[sid])
            assert numpy.array_equal(tokens.numpy(), expected[sid].astype(numpy.int32))
            n += 1
    assert n == 60


def test_items_from_workers_stay_intact_however_many_the_trainer_holds(socket_path, wds):
    """Workers reuse a few shared buffers per worker: an item must never change while the
    trainer holds it, also when it holds more than the buffers (one-off ones then)."""
    pytest.importorskip("torch")
    import gc
    from shardcache import _handoff
    from shardcache.torch import DataLoader, IterableDataset
    ds = IterableDataset(socket_path, "wds", batch_size=4, shuffle="global", seed=8)
    held = list(DataLoader(ds, num_workers=2))   # 30 items from 2 workers of 6 buffers each
    assert len(held) == 30
    for item in held:
        for i, key in enumerate(item["__key__"]):
            assert item["jpg"][i].numpy().tobytes() == wds[key]["jpg"]
            assert item["cls"][i].numpy().tobytes() == wds[key]["cls"]
    # Dropped items free their buffers; a second epoch reuses them and reads right.
    del held, item
    gc.collect()
    assert all(f == 0 for f in ds._handoff.flags)
    keys = []
    for item in DataLoader(ds, num_workers=2, persistent_workers=True):
        for i, key in enumerate(item["__key__"]):
            assert item["json"][i].numpy().tobytes() == wds[key]["json"]
        keys += item["__key__"]
    assert sorted(keys) == sorted(wds)
    assert len([k for k in _handoff._seen if k[0] == ds._handoff.uid]) <= 2 * _handoff.BUFFERS_PER_WORKER


def test_a_nested_dataset_name_reads_end_to_end(socket_path, data_root):
    ds = data_root / "laion" / "train"
    subprocess.run([os.path.join(BIN, "sc_datagen"), "records", str(ds), "--shards", "2",
                    "--records-per-shard", "50", "--record-bytes", "64"], check=True, stdout=subprocess.PIPE)
    subprocess.run([os.path.join(BIN, "shardctl"), "index", str(ds), "--format", "records",
                    "--record-bytes", "64", "--name", "laion/train"], check=True, stdout=subprocess.PIPE)
    client = shardcache.Client(socket_path)
    ids = [int(i) for b in client.loader("laion/train", batch_size=16) for i in b.sample_ids]
    assert sorted(ids) == list(range(100))
