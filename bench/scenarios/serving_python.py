#!/usr/bin/python3
"""bench/run serving_python — samples per second a PyTorch trainer gets from a warm node: the
torch dataset (shardcache.torch) under a torch DataLoader with 0 and 2 workers, decoding
nothing, next to two references measured in the same run on the same tar shards:
  - Python's tarfile reading the shard files (members grouped into samples by key, as
    webdataset's tar iterator does), from the page cache;
  - the C++ client (sc_trainer_bench) reading the same epoch.

Debian's python3 runs it (the one python3-torch is built for).

Data: WebDataset tar shards of small samples (a .jpg of --min-kib to --max-kib, default 2-16
KiB, and a .cls), so that the per-sample cost, not the bytes, decides. Each reader reads whole
epochs in global shuffle order (tarfile: in file order), batches of --batch-size (default 256):
an epoch to warm up, then --epochs (default 3) measured ones, and the figure is their median
(an epoch of small samples lasts tens of milliseconds; one alone is noise). The DataLoader keeps
persistent workers, so its warm-up epoch also holds the worker start-up (printed too).

Figures: samples_per_s_w0, samples_per_s_w2, tarfile_samples_per_s, cpp_samples_per_s,
over_tarfile and over_cpp_client (the better of w0/w2 over each reference; the per-worker-count
ratios are reported as well)."""
import argparse
import os
import sys
import tarfile
import time

import _serving as S

sys.path.insert(0, os.path.join(S.BUILD, "python"))


def tarfile_epoch(data_dir):
    """Samples/s of Python's tarfile grouping members into samples by key (file order)."""
    shards = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir) if f.endswith(".tar"))
    t0 = time.perf_counter()
    samples = 0
    for path in shards:
        with tarfile.open(path, "r") as tar:
            key, sample = None, {}
            for m in tar:
                if not m.isfile():
                    continue
                base, _, ext = m.name.partition(".")
                if base != key:
                    samples += key is not None
                    key, sample = base, {}
                sample[ext] = tar.extractfile(m).read()
            samples += key is not None
    return samples, time.perf_counter() - t0


def median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def torch_epochs(sock, workers, batch_size, epochs):
    import torch  # noqa: F401 - imported before timing
    from shardcache.torch import DataLoader, IterableDataset
    ds = IterableDataset(sock, "wds", batch_size=batch_size, shuffle="global", seed=5)
    dl = DataLoader(ds, num_workers=workers, persistent_workers=workers > 0)
    out = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        n = 0
        for item in dl:
            n += len(item["__key__"])
        out.append((n, time.perf_counter() - t0))
    del dl
    return out


def body(quick, argv):
    ap = argparse.ArgumentParser(prog="bench/run serving_python")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--samples", type=int, default=0, help="samples in the dataset (default 32000; quick 8000)")
    ap.add_argument("--min-kib", type=int, default=2, help="smallest .jpg")
    ap.add_argument("--max-kib", type=int, default=16, help="largest .jpg")
    ap.add_argument("--epochs", type=int, default=3, help="measured epochs per reader")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise S.CannotMeasure("python3-torch is not installed (deploy/setup.sh installs it)")
    S.need("shardcached", "shardctl", "sc_datagen", "sc_trainer_bench")
    b = S.Bench("serving_python")
    samples = args.samples or (8000 if quick else 32000)
    shards = 8
    samples = samples // shards * shards
    data = b.path("data", "wds")
    b.run(os.path.join(S.BIN, "sc_datagen"), "tar", data, "--shards", shards, "--samples-per-shard",
          samples // shards, "--min-bytes", f"{args.min_kib}KiB", "--max-bytes", f"{args.max_kib}KiB")
    b.run(os.path.join(S.BIN, "shardctl"), "index", data, "--format", "tar", "--chunk-bytes", 4 * S.MiB)
    dataset_bytes = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data) if f.endswith(".tar"))
    sock = b.path("node.sock")
    b.daemon("node", "file://" + b.path("data"), socket_path=sock, cache_size=2 * dataset_bytes + 256 * S.MiB,
             memory_size=dataset_bytes + 128 * S.MiB, arena=512 * S.MiB, slots=64)
    common = dict(batch_size=args.batch_size, shuffle="global", seed=5)
    b.trainer_epochs(sock, "wds", epoch=0, **common)  # fill the cache
    print(f"dataset: {samples} samples in {shards} tar shards, {dataset_bytes / S.MiB:.1f} MiB; "
          f"batches of {args.batch_size}; cache warm (DRAM tier holds it)")

    tarfile_epoch(data)  # warms the page cache
    runs = [tarfile_epoch(data) for _ in range(args.epochs)]
    tar_rate = median([n / s for n, s in runs])
    print(f"tarfile:           {tar_rate:10.0f} samples/s (median of {args.epochs} epochs)")

    cpp = b.trainer_epochs(sock, "wds", epoch=1, epochs=1 + args.epochs, **common)[1:]
    cpp_rate = median([e["samples"] / e["wall_s"] for e in cpp])
    print(f"C++ client:        {cpp_rate:10.0f} samples/s (median of {args.epochs} epochs)")

    rates = {}
    for workers in (0, 2):
        runs = torch_epochs(sock, workers, args.batch_size, 1 + args.epochs)
        if any(n != samples for n, _ in runs):
            raise S.CannotMeasure(f"torch dataset with {workers} workers read {[n for n, _ in runs]} samples, not {samples}")
        rates[workers] = median([n / s for n, s in runs[1:]])
        print(f"torch, {workers} workers: {rates[workers]:10.0f} samples/s (median of {args.epochs} epochs; "
              f"the first, with start-up: {runs[0][0] / runs[0][1]:.0f} samples/s)")
    best = max(rates.values())
    figures = {
        "samples_per_s_w0": round(rates[0]),
        "samples_per_s_w2": round(rates[2]),
        "tarfile_samples_per_s": round(tar_rate),
        "cpp_samples_per_s": round(cpp_rate),
        "over_tarfile": round(best / tar_rate, 2),
        "over_cpp_client": round(best / cpp_rate, 3),
        "over_tarfile_w0": round(rates[0] / tar_rate, 2),
        "over_tarfile_w2": round(rates[2] / tar_rate, 2),
        "over_cpp_client_w0": round(rates[0] / cpp_rate, 3),
        "over_cpp_client_w2": round(rates[2] / cpp_rate, 3),
        "batch_size": args.batch_size,
        "samples": samples,
        "jpg_kib": [args.min_kib, args.max_kib],
    }
    print(f"over tarfile: {figures['over_tarfile']}x (target >= 20); over the C++ client: "
          f"{figures['over_cpp_client']} (target >= 0.5)")
    return figures


if __name__ == "__main__":
    S.main(body)
