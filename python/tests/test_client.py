import subprocess
import sys

import numpy
import pytest

import shardcache

from conftest import RECORD_BYTES, RECORDS_PER_SHARD, SHARDS

N = SHARDS * RECORDS_PER_SHARD


def test_the_design_example_runs_as_written(socket_path):
    import shardcache, numpy  # noqa: F811 - exactly as in DESIGN.md
    client = shardcache.Client(socket_path)
    loader = client.loader("tokens-v3", batch_size=32, seed=17, epoch=0, shuffle="block",
                           rank=0, world_size=8, drop_last=True)   # shuffle: none|global|block
    batches = 0
    for batch in loader:                 # shardcache.Batch, valid until released / collected
        ids = batch.sample_ids           # numpy int64, global sample ids in this batch
        raw = batch.sample(0)            # memoryview of one sample's bytes
        x = numpy.from_dlpack(batch)     # dense batches; torch.from_dlpack(batch) likewise
        assert ids.dtype == numpy.int64 and ids.shape == (32,)
        assert isinstance(raw, memoryview) and len(raw) == RECORD_BYTES
        assert x.shape == (32, RECORD_BYTES) and x.dtype == numpy.uint8
        batches += 1
    state = loader.state_dict()          # resume: client.loader(...).load_state_dict(state)
    # 800 samples / 8 ranks = 100 per rank -> 3 full batches of 32 with drop_last.
    assert batches == 3
    assert state["samples_consumed"] == 96
    client.loader("tokens-v3", batch_size=32, seed=17, epoch=0, shuffle="block",
                  rank=0, world_size=8, drop_last=True).load_state_dict(state)


def test_dlpack_round_trip_is_byte_exact(socket_path, expected):
    client = shardcache.Client(socket_path)
    seen = []
    for batch in client.loader("tokens-v3", batch_size=24, seed=5, shuffle="global"):
        x = numpy.from_dlpack(batch)
        assert x.shape == (len(batch), RECORD_BYTES)
        assert not x.flags.writeable  # the arena is mapped read-only in the trainer
        for row, sid in zip(x, batch.sample_ids):
            assert row.tobytes() == expected[sid]
            assert bytes(batch.sample(len(seen) % len(batch))) is not None
        assert bytes(batch.data) == b"".join(expected[s] for s in batch.sample_ids)
        seen += list(batch.sample_ids)
    assert sorted(seen) == list(range(N))


def test_views_keep_their_batch_alive(socket_path, expected):
    client = shardcache.Client(socket_path)
    loader = client.loader("tokens-v3", batch_size=8)
    batch = next(loader)
    view = batch.sample(3)
    arr = numpy.from_dlpack(batch)
    sid = int(batch.sample_ids[3])
    with pytest.raises(BufferError):
        batch.release()          # views are alive
    del batch
    # Drain the rest of the epoch so slots get reused; the held view must not change.
    for b in loader:
        pass
    assert bytes(view) == expected[sid]
    assert arr[3].tobytes() == expected[sid]


def test_state_dict_resume_continues_exactly(socket_path):
    client = shardcache.Client(socket_path)
    kwargs = dict(batch_size=10, seed=9, epoch=2, shuffle="global", rank=1, world_size=3)
    full = [int(i) for b in client.loader("tokens-v3", **kwargs) for i in b.sample_ids]
    assert len(full) == 267  # ceil((800 - 1) / 3)

    first = client.loader("tokens-v3", **kwargs)
    head = []
    for _ in range(4):
        head += [int(i) for i in next(first).sample_ids]
    state = first.state_dict()
    assert state["samples_consumed"] == 40 and state["epoch"] == 2
    first.close()

    other = shardcache.Client(socket_path)
    resumed = other.loader("tokens-v3", **dict(kwargs, epoch=0))
    resumed.load_state_dict(state)
    tail = [int(i) for b in resumed for i in b.sample_ids]
    assert head + tail == full

    with pytest.raises(ValueError):
        other.loader("tokens-v3", **dict(kwargs, seed=10)).load_state_dict(state)


def test_set_epoch_starts_a_new_order(socket_path):
    client = shardcache.Client(socket_path)
    loader = client.loader("tokens-v3", batch_size=100, shuffle="global")
    e0 = [int(i) for b in loader for i in b.sample_ids]
    assert list(loader) == []           # the epoch is over
    loader.set_epoch(1)
    e1 = [int(i) for b in loader for i in b.sample_ids]
    assert sorted(e0) == sorted(e1) == list(range(N)) and e0 != e1
    assert len(loader) == 8


def test_errors_carry_codes(socket_path, tmp_path):
    client = shardcache.Client(socket_path)
    with pytest.raises(shardcache.Error) as e:
        next(client.loader("no-such-dataset"))
    assert e.value.code == 5 and e.value.code_name == "NotFound"
    with pytest.raises(ValueError):
        client.loader("tokens-v3", shuffle="random")
    with pytest.raises(shardcache.Error) as e:
        shardcache.Client(str(tmp_path / "nobody.sock"))
    assert e.value.code == 14


def test_import_does_not_import_torch():
    code = "import sys, shardcache; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torch_iterable_dataset(socket_path, expected):
    torch = pytest.importorskip("torch")
    from shardcache.torch import IterableDataset
    ds = IterableDataset(socket_path, "tokens-v3", batch_size=50, shuffle="block")
    n = 0
    for x, ids in torch.utils.data.DataLoader(ds, batch_size=None):
        for row, sid in zip(x, ids):
            assert bytes(row.numpy()) == expected[int(sid)]
        n += len(ids)
    assert n == N
