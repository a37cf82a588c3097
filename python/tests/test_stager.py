"""shardcache.Stager: batches staged into device memory and handed out through DLPack.

Runs the host path when this machine has no GPU (device="host" forces it either way for the
byte-level checks); the CUDA checks run only where shardcache.cuda_available()."""
import numpy
import pytest

import shardcache

from conftest import RECORD_BYTES, RECORDS_PER_SHARD, SHARDS

N = SHARDS * RECORDS_PER_SHARD
TOKENS = RECORD_BYTES // 2  # uint16 tokens per record


def tokens_of(expected, ids, dtype="<u2"):
    raw = b"".join(expected[int(s)] for s in ids)
    return numpy.frombuffer(raw, dtype=dtype).reshape(len(ids), -1)


def test_a_staged_raw_batch_exports_its_exact_bytes_through_dlpack(socket_path, expected):
    client = shardcache.Client(socket_path)
    loader = client.loader("tokens-v3", batch_size=24, seed=5, shuffle="global")
    stager = shardcache.Stager(client, loader, depth=2, device="host")
    assert len(stager) == (N + 23) // 24
    seen = []
    for batch in stager:
        assert isinstance(batch, shardcache.DeviceBatch)
        assert batch.num_tensors == 1 and batch.device == "cpu"
        x = numpy.from_dlpack(batch.data)
        assert x.dtype == numpy.uint8 and x.shape == (len(batch), RECORD_BYTES)
        assert x.tobytes() == b"".join(expected[int(s)] for s in batch.sample_ids)
        # The batch itself exports its only tensor too.
        assert numpy.array_equal(numpy.from_dlpack(batch), x)
        seen += [int(s) for s in batch.sample_ids]
    assert sorted(seen) == list(range(N))
    assert stager.stats()["batches_staged"] == len(stager)
    # One epoch per iteration, as with the loader.
    assert list(stager) == []


def test_the_stager_follows_the_loaders_order(socket_path):
    client = shardcache.Client(socket_path)
    kwargs = dict(batch_size=10, seed=9, epoch=2, shuffle="block", rank=1, world_size=3)
    plain = [int(i) for b in client.loader("tokens-v3", **kwargs) for i in b.sample_ids]
    staged = [int(i) for b in shardcache.Stager(client, client.loader("tokens-v3", **kwargs), depth=3,
                                                device="host") for i in b.sample_ids]
    assert staged == plain and len(staged) == 267


def test_token_conversion_equals_numpys_astype(socket_path, expected):
    client = shardcache.Client(socket_path)
    stager = shardcache.Stager(client, client.loader("tokens-v3", batch_size=16, shuffle="global", seed=1),
                               convert="tokens_int64", token_dtype="uint16", device="host")
    batches = 0
    for batch in stager:
        t = batch.data
        assert t.dtype == "int64" and t.shape == (len(batch), TOKENS)
        x = numpy.from_dlpack(t)
        assert x.dtype == numpy.int64
        assert numpy.array_equal(x, tokens_of(expected, batch.sample_ids).astype(numpy.int64))
        batches += 1
    assert batches == N // 16


def test_uint32_tokens_convert_too(socket_path, expected):
    client = shardcache.Client(socket_path)
    stager = shardcache.Stager(client, client.loader("tokens-v3", batch_size=8),
                               convert="tokens_int64", token_dtype="uint32", device="host")
    batch = next(iter(stager))
    x = numpy.from_dlpack(batch.data)
    assert x.shape == (8, RECORD_BYTES // 4)
    assert numpy.array_equal(x, tokens_of(expected, batch.sample_ids, "<u4").astype(numpy.int64))


def test_shifted_tokens_form_input_target_pairs(socket_path, expected):
    client = shardcache.Client(socket_path)
    stager = shardcache.Stager(client, client.loader("tokens-v3", batch_size=12, seed=3, shuffle="block"),
                               convert="tokens_shift", device="host")
    for batch in stager:
        assert batch.num_tensors == 2
        inputs, targets = numpy.from_dlpack(batch.inputs), numpy.from_dlpack(batch.targets)
        tok = tokens_of(expected, batch.sample_ids).astype(numpy.int64)
        assert inputs.shape == targets.shape == (len(batch), TOKENS - 1)
        assert numpy.array_equal(inputs, tok[:, :-1])
        assert numpy.array_equal(targets, tok[:, 1:])
        with pytest.raises(ValueError, match="inputs and batch.targets"):
            batch.data


def test_image_conversion_normalizes_hwc_into_chw(socket_path, expected):
    mean, std = [0.5, 0.25, 0.125, 0.0], [0.5, 0.25, 2.0, 1.0]
    client = shardcache.Client(socket_path)
    stager = shardcache.Stager(client, client.loader("tokens-v3", batch_size=5),
                               convert="image_f32", image_size=(8, 8), channels=4, mean=mean, std=std,
                               device="host")
    batch = next(iter(stager))
    x = numpy.from_dlpack(batch.data)
    assert x.dtype == numpy.float32 and x.shape == (5, 4, 8, 8)
    hwc = tokens_of(expected, batch.sample_ids, numpy.uint8).reshape(5, 8, 8, 4).astype(numpy.float32)
    want = (hwc / 255.0 - numpy.array(mean, numpy.float32)) / numpy.array(std, numpy.float32)
    assert numpy.allclose(x, want.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-6)

    bf = shardcache.Stager(client, client.loader("tokens-v3", batch_size=5), convert="image_bf16",
                           image_size=(8, 8), channels=4, device="host")
    t = next(iter(bf)).data
    assert t.dtype == "bfloat16" and t.shape == (5, 4, 8, 8) and t.nbytes == 5 * 4 * 8 * 8 * 2


def test_dlpack_device_is_the_cpu_on_the_host_path(socket_path):
    client = shardcache.Client(socket_path)
    stager = shardcache.Stager(client, client.loader("tokens-v3", batch_size=4), device="host")
    batch = next(iter(stager))
    assert batch.data.__dlpack_device__() == (1, 0)
    assert batch.__dlpack_device__() == (1, 0)
    assert stager.__dlpack_device__() == (1, 0)
    # The host path accepts the array API's stream argument and ignores it.
    assert numpy.from_dlpack(batch.data).shape == (4, RECORD_BYTES)
    capsule = batch.data.__dlpack__(stream=None)
    assert type(capsule).__name__ == "PyCapsule"
    with pytest.raises(BufferError):
        batch.data.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        batch.data.__dlpack__(dl_device=(2, 0))


@pytest.mark.skipif(shardcache.cuda_available(), reason="this machine has a GPU")
def test_auto_selects_the_host_path_without_a_gpu(socket_path):
    client = shardcache.Client(socket_path)
    stager = shardcache.Stager(client, client.loader("tokens-v3", batch_size=4))
    assert stager.device == "host"
    assert next(iter(stager)).__dlpack_device__() == (1, 0)
    with pytest.raises(shardcache.Error) as e:
        shardcache.Stager(client, client.loader("tokens-v3", batch_size=4), device="cuda")
    assert e.value.code_name == "Unavailable"


def test_exported_arrays_keep_their_buffer_while_the_stager_runs_on(socket_path, expected):
    client = shardcache.Client(socket_path)
    # depth 3: the held array pins one buffer, the loop variable another (it still holds batch k
    # while next() stages k+1), the third cycles; with depth 2, next() would wait forever.
    stager = shardcache.Stager(client, client.loader("tokens-v3", batch_size=8, seed=2, shuffle="global"),
                               depth=3, device="host")
    it = iter(stager)
    first = next(it)
    held = numpy.from_dlpack(first.data)
    ids = [int(s) for s in first.sample_ids]
    del first
    # Without the capsule's hold on its buffer, that buffer would be overwritten many times here.
    for batch in it:
        pass
    assert held.tobytes() == b"".join(expected[s] for s in ids)


def test_set_epoch_restages_from_a_partly_consumed_epoch(socket_path):
    client = shardcache.Client(socket_path)
    loader = client.loader("tokens-v3", batch_size=50, seed=4, shuffle="global")
    stager = shardcache.Stager(client, loader, device="host")
    next(iter(stager))  # abandon epoch 0 after one batch
    stager.set_epoch(1)
    assert stager.epoch == 1
    staged = [int(i) for b in stager for i in b.sample_ids]
    loader.set_epoch(1)
    assert staged == [int(i) for b in loader for i in b.sample_ids]


def test_bad_options_are_named(socket_path):
    client = shardcache.Client(socket_path)
    loader = client.loader("tokens-v3", batch_size=4)
    with pytest.raises(ValueError, match="convert must be"):
        shardcache.Stager(client, loader, convert="tokens_int8")
    with pytest.raises(ValueError, match="image_size"):
        shardcache.Stager(client, loader, convert="image_f32")
    with pytest.raises(shardcache.Error, match="height\\*width\\*channels"):
        shardcache.Stager(client, loader, convert="image_f32", image_size=(4, 4), device="host")
    with pytest.raises(shardcache.Error, match="depth"):
        shardcache.Stager(client, loader, depth=0, device="host")


def test_torch_from_dlpack_sees_the_staged_batch(socket_path, expected):
    torch = pytest.importorskip("torch")
    client = shardcache.Client(socket_path)
    stager = shardcache.Stager(client, client.loader("tokens-v3", batch_size=8), convert="tokens_shift")
    batch = next(iter(stager))
    x, y = torch.from_dlpack(batch.inputs), torch.from_dlpack(batch.targets)
    assert x.dtype == torch.int64 and tuple(x.shape) == (8, TOKENS - 1)
    assert x.is_cuda == shardcache.cuda_available()
    tok = tokens_of(expected, batch.sample_ids).astype(numpy.int64)
    assert numpy.array_equal(x.cpu().numpy(), tok[:, :-1])
    assert numpy.array_equal(y.cpu().numpy(), tok[:, 1:])


@pytest.mark.skipif(not shardcache.cuda_available(), reason="no GPU on this machine")
def test_on_a_gpu_tensors_export_with_the_cuda_device_type(socket_path):
    client = shardcache.Client(socket_path)
    stager = shardcache.Stager(client, client.loader("tokens-v3", batch_size=8), convert="tokens_int64")
    assert stager.device.startswith("cuda:0")
    batch = next(iter(stager))
    assert batch.device == "cuda:0"
    assert batch.data.__dlpack_device__() == (2, 0)
    assert type(batch.data.__dlpack__(stream=None)).__name__ == "PyCapsule"  # legacy default stream
    assert type(batch.data.__dlpack__(stream=-1)).__name__ == "PyCapsule"    # no synchronisation
    with pytest.raises(BufferError, match="stream 0 is ambiguous"):
        batch.data.__dlpack__(stream=0)


@pytest.mark.skipif(not shardcache.cuda_available(), reason="no GPU on this machine")
def test_torch_on_a_side_stream_reads_the_copy_it_was_ordered_after(socket_path, expected):
    torch = pytest.importorskip("torch")
    client = shardcache.Client(socket_path)
    stager = shardcache.Stager(client, client.loader("tokens-v3", batch_size=8, seed=6, shuffle="global"),
                               depth=3, convert="tokens_shift")
    side = torch.cuda.Stream()
    for batch in stager:
        with torch.cuda.stream(side):  # torch passes side.cuda_stream as __dlpack__(stream=)
            x = torch.from_dlpack(batch.inputs) + 0
        side.synchronize()
        tok = tokens_of(expected, batch.sample_ids).astype(numpy.int64)
        assert numpy.array_equal(x.cpu().numpy(), tok[:, :-1])
