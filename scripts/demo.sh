#!/usr/bin/env bash
# make demo: the main job on a built-in sample dataset, end to end on loopback.
#   1. generate ~10,000 small files and pack them into tar shards (shardctl pack),
#   2. generate a records dataset and index it (shardctl index),
#   3. start an origin shardcached (upstream = file://) on loopback,
#   4. fetch every shard of both datasets through gRPC and verify every chunk (shardctl fetch),
#   5. a node daemon in front of the origin: 2 C++ ranks read 2 epochs through shared memory,
#   6. the same node from PyTorch: 2 DDP ranks with DataLoader workers, stopped and resumed.
set -euo pipefail
build=${1:-build}
bin=$(cd "$build" && pwd)/bin
work=$(mktemp -d /tmp/shardcache-demo-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
step() { printf '\n== %s\n' "$*"; }

step "generating 10,000 small files"
"$bin/sc_datagen" files "$work/raw-files" --count 10000 --min-bytes 2000 --max-bytes 30000 --seed 1
step "packing them into tar shards"
"$bin/shardctl" pack "$work/raw-files" "$work/root/images" --shard-bytes 32MiB
step "generating and indexing a records dataset"
"$bin/sc_datagen" records "$work/root/tokens" --shards 4 --records-per-shard 8192 --record-bytes 2048 --kind tokens --seed 2
"$bin/shardctl" index "$work/root/tokens" --format records --record-bytes 2048

port=$(free_port)
cat > "$work/origin.toml" <<TOML
upstream = "file://$work/root"
[listen]
origin = "127.0.0.1:$port"
socket = ""
metrics = ""
[cache]
size = "0"
TOML
step "starting the origin daemon on 127.0.0.1:$port"
"$bin/shardcached" --config "$work/origin.toml" >"$work/origin.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do
  (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
  sleep 0.05
done

for ds in images tokens; do
  step "fetching every shard of '$ds' through gRPC"
  shards=$(( $(find "$work/root/$ds" -maxdepth 1 -type f | wc -l) ))
  for ((i = 0; i < shards; i++)); do
    "$bin/shardctl" fetch --upstream "grpc://127.0.0.1:$port" "$ds" "$i" "$work/fetched-$ds-$i"
  done
done
step "done: every chunk of both datasets arrived over gRPC and matched its manifest hash"

# ---- the trainer side: a node daemon with a cache in front of the origin, and 2 ranks of a
# job reading 2 epochs through shared memory (scripts/demo_trainer.py prints a row per epoch).
sock="$work/node.sock"
mport=$(free_port)
cat > "$work/node.toml" <<TOML
upstream = "grpc://127.0.0.1:$port"
[listen]
origin = ""
socket = "$sock"
metrics = "127.0.0.1:$mport"
[cache]
dir = "$work/node-cache"
size = "1GiB"
memory_size = "64MiB"
eviction = "clairvoyant"
segment_size = "64MiB"
[local]
arena_size = "256MiB"
slots = 16
TOML
step "starting a node daemon (NVMe cache in $work/node-cache, upstream = the origin)"
"$bin/shardcached" --config "$work/node.toml" >"$work/node.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 400); do
  [ -S "$sock" ] && curl -sf "http://127.0.0.1:$mport/ready" >/dev/null && break
  sleep 0.05
done
[ -S "$sock" ] || { echo "node daemon did not start; log:"; cat "$work/node.log"; exit 1; }
step "2 ranks read 2 epochs of 'tokens' through the node (block shuffle; epoch 0 cold, epoch 1 warm)"
/usr/bin/python3 "$(dirname "$0")/demo_trainer.py" "$bin" "$sock" "$mport" tokens 2 2

# ---- the same node from PyTorch: python/examples/train_ddp.py, 2 DDP ranks (gloo), each with a
# DataLoader of 2 workers, training on the packed 'images' (fields .jpg/.cls); the job is stopped
# after 5 steps, as a preempted job would be, and resumed from its checkpoint.
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  export PYTHONPATH="$(cd "$build" && pwd)/python${PYTHONPATH:+:$PYTHONPATH}"
  example="$(dirname "$0")/../python/examples/train_ddp.py"
  step "PyTorch: 2 DDP ranks x 2 DataLoader workers train on 'images' (stopped after 5 steps)"
  /usr/bin/python3 "$example" --nproc 2 --socket "$sock" --dataset images --epochs 2 --workers 2 \
    --checkpoint "$work/ckpt.pt" --stop-after 5
  step "PyTorch: the job resumes from its checkpoint and finishes both epochs"
  /usr/bin/python3 "$example" --nproc 2 --socket "$sock" --dataset images --epochs 2 --workers 2 \
    --checkpoint "$work/ckpt.pt"
else
  step "python3-torch is not installed: skipping the PyTorch part (deploy/setup.sh installs it)"
fi
