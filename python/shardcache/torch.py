"""torch integration: a DataLoader-ready IterableDataset over the node's shardcached.

torch is imported when this module is imported, never by `import shardcache`, so the client
works on machines without torch.

    from shardcache.torch import IterableDataset, DataLoader
    ds = IterableDataset("/run/shardcache/shardcached.sock", "imagenet-wds", batch_size=64,
                         seed=17, shuffle="block")       # rank/world_size from torch.distributed
    loader = DataLoader(ds, num_workers=4)              # batch_size=None: items are batches
    for epoch in range(3):
        ds.set_epoch(epoch)                             # optional: epochs also advance by themselves
        for batch in loader:
            images = batch["jpg"]                       # Ragged: batch["jpg"][i] is a uint8 tensor
            labels = batch["cls"]
        ...
    state = loader.state_dict()                         # what the trainer has seen, exactly
    # later, on any number of workers or ranks: loader.load_state_dict(state)

Items are whole batches (one per DataLoader step; use batch_size=None with a plain DataLoader):
  records  -> (uint8 tensor [B, record_bytes], int64 tensor of sample ids)
  tar      -> {"__key__": [str], "__id__": int64 tensor, "<ext>": Ragged, ...}: one entry per
              member name ("jpg", "cls", "seg.png"); Ragged views the batch's bytes, no copy
  megatron -> {"__id__": int64 tensor, "tokens": Ragged of token tensors, "length": int64 tensor}
              (tokens in the .idx dtype; uint16, which torch lacks, is widened to int32)
`decode=` turns tar fields into values ({"cls": int} or "basic": cls/id/index -> int tensor,
txt -> str, json -> object, npy -> array); `map=` runs on every sample in the worker (a dict of
memoryviews for tar, a numpy array otherwise) and `collate=` (default torch's default_collate)
turns the mapped samples into the item.

DataLoader workers: worker k of K reads batches k, k+K, ... of its rank, so a DataLoader, which
takes one batch from each worker in turn, yields exactly the rank's order whatever num_workers
is, each sample once. Every rank yields the same number of batches (DDP-safe): with
drop_last=False a rank one sample short repeats the first sample of its own order, like
torch's DistributedSampler; drop_last=True drops the epoch's last samples instead.

Epochs: each new iteration starts the next epoch unless set_epoch() or load_state_dict() was
called since (logged once), whether or not workers are persistent.

Resume: shardcache.torch.DataLoader counts what it has yielded, so its state_dict() (the same as
the dataset's) is exact with any num_workers; a plain torch DataLoader is exact only with
num_workers=0, and with workers the dataset's state_dict() raises instead of guessing. A state
holds the dataset version and plan parameters; resuming on another version raises naming both,
and resuming on another world size continues the epoch with no sample repeated or skipped.
"""
import json
import logging
import multiprocessing
import os

import numpy as _np
import torch as _torch

import shardcache as _sc
from shardcache import _handoff

__all__ = ["IterableDataset", "DataLoader", "Ragged", "BASIC_DECODERS"]

_log = logging.getLogger("shardcache.torch")

# DataLoader workers one dataset supports (one shared counter each).
MAX_WORKERS = 256


class Ragged:
    """One field of a batch: variable-length values as views of one flat tensor.

    ragged[i] is sample i's value (a 1-D tensor view, or None when the sample lacks the field);
    len(ragged) is the batch size. Passing it between processes moves three tensors, not one
    per sample.
    """
    __slots__ = ("data", "offsets", "lengths")

    def __init__(self, data, offsets, lengths):
        self.data = data          # 1-D tensor
        self.offsets = offsets    # int64 tensor [B], in elements of data
        self.lengths = lengths    # int64 tensor [B], -1 where absent

    def __len__(self):
        return len(self.offsets)

    def __getitem__(self, i):
        n = int(self.lengths[i])
        if n < 0:
            return None
        o = int(self.offsets[i])
        return self.data[o:o + n]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def tolist(self):
        """Every sample's value (tensor views, None where absent)."""
        return list(self)

    def stack(self):
        """A [B, L] tensor (a copy) when every sample has the field at the same length."""
        lengths = self.lengths.tolist()
        if not lengths or min(lengths) < 0 or min(lengths) != max(lengths):
            raise ValueError("samples have this field at different lengths (or lack it): cannot stack")
        return _torch.stack(list(self))

    def pin_memory(self):
        """A copy in pinned memory (DataLoader(pin_memory=True) calls it)."""
        return Ragged(self.data.pin_memory(), self.offsets, self.lengths)

    def __repr__(self):
        return "Ragged(%d values, %s)" % (len(self), self.data.dtype)


def _int(b):
    return int(bytes(b))


BASIC_DECODERS = {
    "cls": _int, "cls2": _int, "class": _int, "index": _int, "inx": _int, "id": _int, "count": _int,
    "txt": lambda b: bytes(b).decode("utf-8"), "text": lambda b: bytes(b).decode("utf-8"),
    "json": lambda b: json.loads(bytes(b)), "jsn": lambda b: json.loads(bytes(b)),
    "npy": lambda b: _np.load(__import__("io").BytesIO(bytes(b)), allow_pickle=False),
}

_TORCH_DTYPES = {"uint8": _torch.uint8, "int8": _torch.int8, "int16": _torch.int16, "int32": _torch.int32,
                 "int64": _torch.int64, "float32": _torch.float32, "float64": _torch.float64}

# Shared (cross-process) slots: set_epoch/load_state_dict in the main process reach workers,
# persistent or not, and workers report that they ran under a plain DataLoader.
_BASE_EPOCH, _RESUME, _RESUME_START, _RESUME_CONSUMED, _RESUME_WINDOW, _UNTAGGED, _LOGGED = range(7)
_COUNTS = 8  # then one iteration counter per worker


class _Tagged:
    """A worker's item with the rank's progress after it, for shardcache.torch.DataLoader."""
    __slots__ = ("progress", "item")

    def __init__(self, progress, item):
        self.progress = progress
        self.item = item

    def pin_memory(self):
        return _Tagged(self.progress, _torch.utils.data._utils.pin_memory.pin_memory(self.item))


def _as_is(item):
    return item


class _TaggedCollate:
    """The DataLoader's collate_fn applied inside the tag, in the worker, so that items look the
    same with or without tags. By default items pass as they are: they hold tensors already, and
    torch's default_convert would only walk every key of every batch (a third of the time of a
    batch of small samples)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, data):
        if isinstance(data, _Tagged):
            return _Tagged(data.progress, self.fn(data.item))
        return self.fn(data)


def _default_rank_world():
    dist = _torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class IterableDataset(_torch.utils.data.IterableDataset):
    """Batches of one rank of a dataset served by the node's shardcached (see the module doc)."""

    def __init__(self, socket_path, dataset, batch_size=32, seed=0, epoch=0, shuffle="none",
                 rank=None, world_size=None, drop_last=False, map=None, collate=None, decode=None,
                 block_window_shards=0, timeout_ms=0):
        super().__init__()
        if rank is None or world_size is None:
            r, w = _default_rank_world()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        if shuffle not in ("none", "global", "block"):
            raise ValueError("shuffle %r is not one of none|global|block" % (shuffle,))
        self.socket_path = socket_path or _sc.DEFAULT_SOCKET
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.map = map
        self.collate = collate
        self.decode = BASIC_DECODERS if decode == "basic" else (decode or {})
        self.block_window_shards = block_window_shards
        self.timeout_ms = timeout_ms
        self._shared = multiprocessing.RawArray("q", _COUNTS + MAX_WORKERS)
        self._shared[_BASE_EPOCH] = epoch
        self._version = multiprocessing.RawArray("c", 64)  # the resumed state's version
        self._handoff = _handoff.Handoff(MAX_WORKERS)
        self._tagged = False          # set by shardcache.torch.DataLoader
        self._progress = None         # main process: the last item's (epoch, start, consumed, per rank, version, window)
        self._client = None
        self._client_pid = None
        self._len_cache = None

    # ---- epochs and state

    def set_epoch(self, epoch):
        """The next iteration reads epoch `epoch` from its start (in every worker)."""
        s = self._shared
        s[_BASE_EPOCH] = epoch
        s[_RESUME] = 0
        s[_COUNTS:] = [0] * MAX_WORKERS
        self._progress = None

    def state_dict(self):
        """Where the trainer stands: the batches the DataLoader has yielded, not what workers
        prefetched. Resumes exactly with load_state_dict() on any num_workers or world size."""
        p = self._progress
        if p is None:
            if self._shared[_UNTAGGED] and not self._tagged:
                raise RuntimeError(
                    "state_dict() cannot know what a plain torch DataLoader with workers has yielded "
                    "(its workers prefetch); iterate with shardcache.torch.DataLoader, whose "
                    "state_dict() is exact, or with num_workers=0")
            s = self._shared
            if s[_RESUME]:
                p = (s[_BASE_EPOCH], s[_RESUME_START], s[_RESUME_CONSUMED], None,
                     self._version.value.decode(), s[_RESUME_WINDOW])
            else:
                p = (s[_BASE_EPOCH] + s[_COUNTS], 0, 0, None, "", self.block_window_shards)
        epoch, start, consumed, per_rank, version, window = p
        if per_rank is not None and consumed >= per_rank:
            # The epoch is done: resume at the start of the next one.
            epoch, start, consumed, window = epoch + 1, 0, 0, self.block_window_shards
        return {
            "dataset": self.dataset, "version": version, "seed": self.seed, "epoch": epoch,
            "shuffle": self.shuffle, "batch_size": self.batch_size, "drop_last": self.drop_last,
            "pad": True, "rank": self.rank, "world_size": self.world_size,
            "start_position": start, "samples_consumed": consumed,
            "position": start + consumed * self.world_size, "block_window_shards": window,
        }

    def load_state_dict(self, state):
        """Continue from state_dict() of this dataset, or of another rank, world size or worker
        count of the same job. The dataset must still be at the state's version."""
        for key in ("dataset", "seed", "shuffle", "batch_size", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError("state_dict was saved with a different %s: %r (this dataset: %r)"
                                 % (key, state[key], getattr(self, key)))
        if state.get("world_size") == self.world_size and state.get("rank") == self.rank:
            start, consumed = state.get("start_position", 0), state["samples_consumed"]
        elif "position" in state:
            start, consumed = state["position"], 0
        else:
            raise ValueError("state_dict has no global 'position' (saved by an older shardcache): "
                             "resume it with the world_size and rank it was saved with")
        version = state.get("version", "") or ""
        s = self._shared
        s[_COUNTS:] = [0] * MAX_WORKERS
        s[_BASE_EPOCH] = state["epoch"]
        s[_RESUME_START] = start
        s[_RESUME_CONSUMED] = consumed
        s[_RESUME_WINDOW] = state.get("block_window_shards", self.block_window_shards)
        self._version.value = version.encode()
        s[_RESUME] = 1
        self._progress = None
        self._len_cache = None

    # ---- iteration

    def __len__(self):
        """Batches per epoch for this rank (what every rank's DataLoader yields)."""
        if self._len_cache is None:
            loader = self._open(self._shared[_BASE_EPOCH], 0, 1, fields=False)
            n = loader.samples_per_epoch
            loader.close()
            self._len_cache = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return self._len_cache

    def __iter__(self):
        info = _torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if workers > MAX_WORKERS:
            raise ValueError("shardcache.torch supports at most %d DataLoader workers" % MAX_WORKERS)
        s = self._shared
        if info is not None and not self._tagged:
            s[_UNTAGGED] = 1
        count = s[_COUNTS + worker]
        s[_COUNTS + worker] = count + 1
        epoch = s[_BASE_EPOCH] + count
        if count > 0 and worker == 0 and not s[_LOGGED]:
            s[_LOGGED] = 1
            _log.info("shardcache: starting epoch %d of '%s' by itself (set_epoch was not called since "
                      "the last iteration)", epoch, self.dataset)
        loader = self._open(epoch, worker, workers, fields=True)
        if count == 0 and s[_RESUME]:
            loader.load_state_dict({
                "epoch": epoch, "rank": self.rank, "world_size": self.world_size,
                "start_position": s[_RESUME_START], "samples_consumed": s[_RESUME_CONSUMED],
                "block_window_shards": s[_RESUME_WINDOW], "version": self._version.value.decode()})
        try:
            per_rank = loader.samples_per_epoch
            version = loader.version
            window = s[_RESUME_WINDOW] if count == 0 and s[_RESUME] else self.block_window_shards
            start = s[_RESUME_START] if count == 0 and s[_RESUME] else 0
            convert = self._converter(loader, worker)
            for batch in loader:
                progress = (epoch, start, batch.samples_consumed_after, per_rank, version, window)
                item = convert(batch)
                del batch
                if self._tagged and info is not None:
                    yield _Tagged(progress, item)
                else:
                    self._progress = progress
                    yield item
        finally:
            loader.close()

    def _note(self, progress):
        # The DataLoader yielded the item that came with `progress`.
        self._progress = progress

    def _client_here(self):
        # A connection belongs to one process: a forked worker connects anew.
        if self._client is None or self._client_pid != os.getpid():
            self._client = _sc.Client(self.socket_path)
            self._client_pid = os.getpid()
        return self._client

    def _open(self, epoch, worker, workers, fields):
        return self._client_here().loader(
            self.dataset, batch_size=self.batch_size, seed=self.seed, epoch=epoch, shuffle=self.shuffle,
            rank=self.rank, world_size=self.world_size, drop_last=self.drop_last,
            block_window_shards=self.block_window_shards, timeout_ms=self.timeout_ms,
            worker=worker, num_workers=workers, fields=fields)

    def __getstate__(self):
        # Workers started by spawn get a copy without the connection.
        state = dict(self.__dict__)
        state["_client"] = None
        state["_client_pid"] = None
        return state

    # ---- batch -> item

    def _converter(self, loader, worker):
        """batch -> item. Without map=, an item is made of one data tensor and one int64 table
        (ids, then offsets/lengths) plus small Python parts; in a DataLoader worker those go to
        the main process through a reused shared buffer (_handoff.py)."""
        fmt = loader.format
        if self.map is not None:
            collate = self.collate or _torch.utils.data.default_collate
            sample = self._sample_reader(fmt, loader)
            return lambda b: collate([self.map(sample(b, i)) for i in range(len(b))])
        parts = {"records": _records_parts, "tar": self._tar_parts,
                 "megatron": _megatron_parts(_np.dtype(loader.sample_dtype or "uint8"))}[fmt]
        if _torch.utils.data.get_worker_info() is None:
            return lambda b: _build(*parts(b))

        def packed(b):
            kind, data, table, extra = parts(b)
            return self._handoff.pack(worker, (kind, extra), data, table)
        return packed

    def _sample_reader(self, fmt, loader):
        if fmt == "tar":
            def tar_sample(b, i):
                d = b.fields(i)
                for name, fn in self.decode.items():
                    if name in d:
                        d[name] = fn(d[name])
                return d
            return tar_sample
        dtype = _np.dtype(loader.sample_dtype or "uint8")
        return lambda b, i: _np.frombuffer(b.sample(i), dtype=dtype)  # read-only view

    def _tar_parts(self, b):
        names, table = b.columns()
        payload = _torch.from_dlpack(b.payload())
        decoded = {}
        for k, name in enumerate(names):
            fn = self.decode.get(name)
            if fn is not None:
                decoded[name] = [None if n < 0 else fn(payload[o:o + n].numpy().data)
                                 for o, n in zip(table[1 + 2 * k].tolist(), table[2 + 2 * k].tolist())]
        return "tar", payload, _torch.from_numpy(table), (names, b.keys, decoded)


def _records_parts(b):
    return "records", _torch.from_dlpack(b.payload()), _torch.from_numpy(b.sample_ids).view(1, -1), b.record_bytes


def _megatron_parts(dtype):
    def parts(b):
        # Samples lie back to back: offsets are the running sum of the lengths, in tokens.
        table = _np.zeros((3, len(b)), _np.int64)
        table[0] = b.sample_ids
        table[2] = [len(b.sample(i)) // dtype.itemsize for i in range(len(b))]
        _np.cumsum(table[2, :-1], out=table[1, 1:])
        if dtype == _np.uint16:  # torch has no uint16: widen (a copy), values kept
            data = _torch.from_numpy(_np.frombuffer(b.data, dtype=dtype).astype(_np.int32))
        else:
            data = _torch.from_dlpack(b.payload()).view(_TORCH_DTYPES[dtype.name])
        return "megatron", data, _torch.from_numpy(table), None
    return parts


def _build(kind, data, table, extra):
    """The item of a batch from its data tensor, int64 table and small parts."""
    if kind == "records":
        return data.view(-1, extra) if extra else data.view(0, 0), table[0]
    if kind == "megatron":
        return {"__id__": table[0], "tokens": Ragged(data, table[1], table[2]), "length": table[2]}
    names, keys, decoded = extra
    item = {"__key__": keys, "__id__": table[0]}
    for k, name in enumerate(names):
        values = decoded.get(name)
        if values is None:
            item[name] = Ragged(data, table[1 + 2 * k], table[2 + 2 * k])
        elif values and all(type(v) is int for v in values):
            item[name] = _torch.tensor(values)
        else:
            item[name] = values
    return item


class DataLoader(_torch.utils.data.DataLoader):
    """torch's DataLoader for a shardcache.torch.IterableDataset that knows what it has yielded:
    state_dict() / load_state_dict() resume exactly with any num_workers. Items are batches
    (batch_size defaults to None)."""

    def __init__(self, dataset, **kwargs):
        if not isinstance(dataset, IterableDataset):
            raise TypeError("shardcache.torch.DataLoader takes a shardcache.torch.IterableDataset")
        kwargs.setdefault("batch_size", None)
        if kwargs["batch_size"] is not None:
            raise ValueError("items of a shardcache.torch.IterableDataset are batches already: "
                             "leave batch_size=None (set the dataset's batch_size)")
        kwargs["collate_fn"] = _TaggedCollate(kwargs.get("collate_fn") or _as_is)
        super().__init__(dataset, **kwargs)
        dataset._tagged = True

    def __iter__(self):
        for item in super().__iter__():
            if isinstance(item, _Tagged):
                self.dataset._note(item.progress)
                item = item.item
            yield item

    def state_dict(self):
        """The rank's position after the last batch this DataLoader yielded (exact with any
        num_workers); the same as the dataset's state_dict()."""
        return self.dataset.state_dict()

    def load_state_dict(self, state):
        """Continue from a state_dict() of this job, on any num_workers, rank or world size."""
        self.dataset.load_state_dict(state)
