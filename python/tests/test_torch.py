"""shardcache.torch as PyTorch users run it: a real torch DataLoader with workers (persistent or
not), resume from its state_dict, a multi-rank gloo DDP job, a resume onto another world size.
Every order is checked against the daemon's plan read through a plain loader."""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import shardcache  # noqa: E402
from shardcache.torch import DataLoader, IterableDataset  # noqa: E402

from conftest import RECORDS_PER_SHARD, SHARDS  # noqa: E402

N = SHARDS * RECORDS_PER_SHARD  # 800


def plan_order(socket_path, epoch, rank=0, world_size=1, batch_size=10, shuffle="global", seed=4):
    """The rank's epoch as one plain loader (no workers) reads it."""
    client = shardcache.Client(socket_path)
    loader = client.loader("tokens-v3", batch_size=batch_size, seed=seed, epoch=epoch, shuffle=shuffle,
                           rank=rank, world_size=world_size)
    return [int(i) for b in loader for i in b.sample_ids]


def ids_of(item):
    return [int(i) for i in item[1]]


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True), (4, False), (4, True)])
@pytest.mark.parametrize("call_set_epoch", [True, False])
def test_dataloader_workers_read_the_rank_order_once_per_epoch(socket_path, expected, workers, persistent,
                                                                call_set_epoch):
    ds = IterableDataset(socket_path, "tokens-v3", batch_size=10, seed=4, shuffle="global", rank=1, world_size=3)
    dl = DataLoader(ds, num_workers=workers, persistent_workers=persistent)
    # 800 samples on 3 ranks, padded to 267 each: 27 batches, the last of 7.
    assert len(ds) == 27
    for epoch in range(3):
        if call_set_epoch:
            ds.set_epoch(epoch)
        got = []
        for x, ids in dl:
            assert x.shape == (len(ids), 256) and x.dtype == torch.uint8
            for row, sid in zip(x, ids.tolist()):
                assert row.numpy().tobytes() == expected[sid]
            got += ids.tolist()
        # Exactly the rank's order of this epoch (each sample once; epochs advance by themselves).
        assert got == plan_order(socket_path, epoch, rank=1, world_size=3)
    assert plan_order(socket_path, 0, 1, 3) != plan_order(socket_path, 1, 1, 3)


def test_resume_mid_epoch_with_workers_equals_the_uninterrupted_run(socket_path):
    full = plan_order(socket_path, epoch=2)
    ds = IterableDataset(socket_path, "tokens-v3", batch_size=10, seed=4, epoch=2, shuffle="global")
    dl = DataLoader(ds, num_workers=2)
    head = []
    for step, item in enumerate(dl):
        head += ids_of(item)
        if step == 6:
            break
    state = dl.state_dict()
    assert state["epoch"] == 2 and state["samples_consumed"] == 70
    del dl
    for workers in (2, 3, 0):
        ds2 = IterableDataset(socket_path, "tokens-v3", batch_size=10, seed=4, shuffle="global")
        dl2 = DataLoader(ds2, num_workers=workers)
        dl2.load_state_dict(state)
        rest = [i for item in dl2 for i in ids_of(item)]
        assert head + rest == full
        # The next iteration is the next epoch, from its start.
        assert [i for item in dl2 for i in ids_of(item)] == plan_order(socket_path, epoch=3)


def test_state_at_the_end_of_an_epoch_resumes_at_the_next(socket_path):
    ds = IterableDataset(socket_path, "tokens-v3", batch_size=100, seed=4, shuffle="global")
    dl = DataLoader(ds, num_workers=2)
    assert sum(len(item[1]) for item in dl) == N
    state = dl.state_dict()
    assert (state["epoch"], state["samples_consumed"]) == (1, 0)


def test_a_plain_dataloader_with_workers_cannot_fake_a_state(socket_path):
    ds = IterableDataset(socket_path, "tokens-v3", batch_size=50)
    for _ in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
        break
    with pytest.raises(RuntimeError, match="shardcache.torch.DataLoader"):
        ds.state_dict()
    # Without workers the plain DataLoader is exact.
    ds = IterableDataset(socket_path, "tokens-v3", batch_size=50)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None))
    next(it)
    next(it)
    assert ds.state_dict()["samples_consumed"] == 100


def test_a_state_of_another_dataset_version_is_refused_naming_both(socket_path):
    ds = IterableDataset(socket_path, "tokens-v3", batch_size=10)
    state = ds.state_dict()
    current = shardcache.Client(socket_path).loader("tokens-v3").version
    state["version"] = "0" * 32
    ds.load_state_dict(state)
    with pytest.raises(shardcache.Error) as e:
        for _ in DataLoader(ds, num_workers=0):
            pass
    assert "0" * 32 in str(e.value) and current in str(e.value)


def test_a_state_with_other_plan_parameters_is_refused(socket_path):
    state = IterableDataset(socket_path, "tokens-v3", batch_size=10, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        IterableDataset(socket_path, "tokens-v3", batch_size=10, seed=2).load_state_dict(state)


@pytest.mark.parametrize("shuffle", ["none", "global", "block"])
@pytest.mark.parametrize("new_world", [3, 6])
def test_resume_from_4_ranks_onto_another_world_size_sees_every_sample_once(socket_path, shuffle, new_world):
    seen = []
    state = None
    for rank in range(4):
        ds = IterableDataset(socket_path, "tokens-v3", batch_size=10, seed=9, epoch=1, shuffle=shuffle,
                             rank=rank, world_size=4)
        dl = DataLoader(ds, num_workers=2 if rank == 0 else 0)
        for step, item in enumerate(dl):
            seen += ids_of(item)
            if step == 4:
                break
        if rank == 0:
            state = dl.state_dict()
    assert state["position"] == 200
    for rank in range(new_world):
        ds = IterableDataset(socket_path, "tokens-v3", batch_size=10, seed=9, shuffle=shuffle,
                             rank=rank, world_size=new_world)
        dl = DataLoader(ds, num_workers=2)
        dl.load_state_dict(state)  # any rank's state of the old job does
        seen += [i for item in dl for i in ids_of(item)]
    # 600 samples left split evenly: no padding, so each of the 800 exactly once.
    assert sorted(seen) == list(range(N))


DDP_SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from shardcache.torch import IterableDataset, DataLoader
    rank, world, init_file, sock = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # rank and world_size come from torch.distributed; 800 samples, batches of 32 on 3 ranks.
    ds = IterableDataset(sock, "tokens-v3", batch_size=32, seed=1, shuffle="block", drop_last=False)
    dl = DataLoader(ds, num_workers=2)
    steps = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        n = 0
        for x, ids in dl:
            loss = model(x.float() / 255).mean()   # every step is a collective: uneven counts hang
            opt.zero_grad(); loss.backward(); opt.step()
            n += 1
        steps.append(n)
    dist.barrier()
    print("steps", rank, steps, flush=True)
""")


def test_a_3_rank_gloo_ddp_job_with_drop_last_false_completes_2_epochs(socket_path, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    init = tmp_path / "init"
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "3", str(init), socket_path],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env) for r in range(3)]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=240)
            outs.append(out.decode())
            assert p.returncode == 0, out.decode()
    finally:
        for p in procs:
            p.kill()
    # ceil(800 / 3) = 267 samples per rank: 9 batches (the last of 11) for every rank, both epochs.
    for r, out in enumerate(outs):
        assert "steps %d [9, 9]" % r in out, out


def test_a_state_saved_before_a_reindex_is_refused_naming_both_versions(socket_path, data_root):
    """The issue's case: the dataset re-indexed at the origin with another chunk size (the same
    samples, a new version) must not resume silently into a different plan."""
    import shutil
    ds_dir = data_root / "reindexed"
    shutil.copytree(data_root / "tokens-v3", ds_dir, ignore=shutil.ignore_patterns(".shardcache"))

    def index(chunk):
        subprocess.run([os.path.join(os.environ["SHARDCACHE_BUILD_DIR"], "bin", "shardctl"), "index", str(ds_dir),
                        "--format", "records", "--record-bytes", "256", "--chunk-bytes", str(chunk)],
                       check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    index(16384)
    ds = IterableDataset(socket_path, "reindexed", batch_size=10, shuffle="global")
    dl = DataLoader(ds, num_workers=2)
    for step, _ in enumerate(dl):
        if step == 3:
            break
    state = dl.state_dict()
    old = state["version"]
    index(8192)
    new = shardcache.Client(socket_path).loader("reindexed").version
    assert new != old
    ds2 = IterableDataset(socket_path, "reindexed", batch_size=10, shuffle="global")
    ds2.load_state_dict(state)
    with pytest.raises(shardcache.Error) as e:
        for _ in DataLoader(ds2, num_workers=2):
            pass
    assert old in str(e.value) and new in str(e.value)
    # Started afresh, the new version reads every sample once.
    ds3 = IterableDataset(socket_path, "reindexed", batch_size=10, shuffle="global")
    assert sorted(i for item in DataLoader(ds3, num_workers=2) for i in ids_of(item)) == list(range(N))


def test_a_dataloader_with_workers_reads_through_a_daemon_killed_and_restarted(data_root, tmp_path):
    """The node daemon killed with SIGKILL mid-epoch and started again: every worker's client
    reconnects and the epoch goes on from where the trainer was, each sample once, in order."""
    import signal
    import time
    sock = str(tmp_path / "restart.sock")

    def start():
        proc = subprocess.Popen([os.path.join(os.environ["SHARDCACHE_BUILD_DIR"], "bin", "local_serve_helper"),
                                 str(data_root), sock, str(16 << 20), "16"], stdout=subprocess.PIPE)
        assert proc.stdout.readline().strip() == b"ready"
        return proc

    daemon = start()
    try:
        ds = IterableDataset(sock, "tokens-v3", batch_size=10, seed=4, epoch=1, shuffle="global")
        got = []
        for step, item in enumerate(DataLoader(ds, num_workers=2)):
            got += ids_of(item)
            if step in (5, 40):
                daemon.send_signal(signal.SIGKILL)
                daemon.wait()
                time.sleep(0.3)
                daemon = start()
        assert got == plan_order(sock, epoch=1)
    finally:
        daemon.kill()
        daemon.wait()


def test_epochs_advance_by_themselves_with_one_log_line(socket_path, caplog):
    import logging
    ds = IterableDataset(socket_path, "tokens-v3", batch_size=100, seed=4, shuffle="global")
    dl = DataLoader(ds, num_workers=0)
    with caplog.at_level(logging.INFO, logger="shardcache.torch"):
        epochs = [[i for item in dl for i in ids_of(item)] for _ in range(3)]
    assert epochs == [plan_order(socket_path, e, batch_size=100) for e in range(3)]
    assert len([r for r in caplog.records if "set_epoch was not called" in r.getMessage()]) == 1
