"""torch integration: an IterableDataset over a shardcache loader.

torch is imported when this module is imported, never by `import shardcache`, so the client
works on machines without torch.

    from shardcache.torch import IterableDataset
    ds = IterableDataset("/run/shardcache/shardcached.sock", "tokens-v3", batch_size=32,
                         seed=17, shuffle="block", rank=rank, world_size=world, drop_last=True)
    for epoch in range(3):
        ds.set_epoch(epoch)
        for x, ids in torch.utils.data.DataLoader(ds, batch_size=None):
            ...   # x: uint8 tensor [B, record_bytes] (zero-copy view of shared memory)

Each item is one whole batch (use DataLoader(batch_size=None)). Dense datasets (fixed-size
records) yield (tensor, sample_ids); others yield (list of uint8 tensors, sample_ids).
The tensors view shared memory: the batch's slot returns to the daemon when they are freed.
Use num_workers=0 (the daemon already prefetches; workers would each need their own rank).
"""
import torch as _torch

import shardcache as _sc


class IterableDataset(_torch.utils.data.IterableDataset):
    def __init__(self, socket_path, dataset, batch_size=32, seed=0, epoch=0, shuffle="none",
                 rank=0, world_size=1, drop_last=False):
        super().__init__()
        self._socket_path = socket_path
        self._kwargs = dict(batch_size=batch_size, seed=seed, epoch=epoch, shuffle=shuffle,
                            rank=rank, world_size=world_size, drop_last=drop_last)
        self._dataset = dataset
        self._client = None
        self._loader = None
        self._pending_state = None

    def _get_loader(self):
        if self._loader is None:
            self._client = _sc.Client(self._socket_path)
            self._loader = self._client.loader(self._dataset, **self._kwargs)
            if self._pending_state is not None:
                self._loader.load_state_dict(self._pending_state)
                self._pending_state = None
        return self._loader

    def set_epoch(self, epoch):
        self._kwargs["epoch"] = epoch
        if self._loader is not None:
            self._loader.set_epoch(epoch)

    def state_dict(self):
        return self._get_loader().state_dict()

    def load_state_dict(self, state):
        if self._loader is None:
            self._pending_state = dict(state)
        else:
            self._loader.load_state_dict(state)

    def __len__(self):
        return len(self._get_loader())

    def __iter__(self):
        loader = self._get_loader()
        for batch in loader:
            ids = _torch.from_numpy(batch.sample_ids)
            if batch.record_bytes:
                yield _torch.from_dlpack(batch), ids
            else:
                yield [_torch.frombuffer(batch.sample(i), dtype=_torch.uint8)
                       for i in range(len(batch))], ids
