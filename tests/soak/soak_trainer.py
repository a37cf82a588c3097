#!/usr/bin/env python3
"""One rank of one epoch for tests/soak/soak.py: reads its loader to the end through the Python
client and checks every sample's bytes against the dataset's shard files.

  soak_trainer.py SOCKET DATASET_DIR RECORD_BYTES EPOCH RANK WORLD_SIZE

Prints one JSON line: {"samples": N, "wrong": W, "ids_hash": H} (H: a hash of the ids in the
order received, so two runs of the same rank can be compared). Exit 0 when every batch arrived.
A soak run also kills some of these with SIGKILL mid-epoch (an abrupt client)."""
import hashlib
import json
import mmap
import os
import sys

import shardcache


def main():
    socket, data_dir, record_bytes, epoch, rank, world = sys.argv[1:7]
    record_bytes, epoch, rank, world = int(record_bytes), int(epoch), int(rank), int(world)
    # Manifest order of a records dataset = the shard files sorted by name.
    shards = sorted(f for f in os.listdir(data_dir) if f.endswith(".bin"))
    maps = []
    for name in shards:
        with open(os.path.join(data_dir, name), "rb") as f:
            maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    per_shard = len(maps[0]) // record_bytes

    client = shardcache.Client(socket)
    loader = client.loader(os.path.basename(data_dir), batch_size=64, seed=11, epoch=epoch,
                           shuffle="global", rank=rank, world_size=world, pad=False,
                           timeout_ms=120000)
    samples = wrong = 0
    order = hashlib.blake2b(digest_size=16)
    for batch in loader:
        ids = batch.sample_ids
        order.update(ids.tobytes())
        for i in range(len(batch)):
            sid = int(ids[i])
            m = maps[sid // per_shard]
            off = (sid % per_shard) * record_bytes
            if batch.sample(i) != m[off:off + record_bytes]:
                wrong += 1
        samples += len(batch)
        batch.release()
    print(json.dumps({"samples": samples, "wrong": wrong, "ids_hash": order.hexdigest()}), flush=True)


if __name__ == "__main__":
    main()
