#!/usr/bin/env python3
"""Checks that no function in daemon/, client/ or gpu/ is longer than 80 lines (issue 15).

  tests/style/function_length.py [--list]

A function is a definition that starts at column 0 (`Type Name(...) {`, the signature may span
lines) and ends at the next `}` at column 0; its length counts the lines between the two braces.
Functions defined inside class bodies are short by house style and not measured.

Functions that were already longer when the check was added are listed in KNOWN with their
length then: they may shrink, never grow, and a new long function fails. Split one, and remove
it from KNOWN (the check says so when an entry is stale). --list prints every function over the
limit."""
import os
import re
import sys

LIMIT = 80
ROOTS = ("daemon", "client", "gpu")
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "../.."))

# file:function -> length when the check was added (to be split; see issue 15).
KNOWN = {
    "client/src/client.cc:LoaderCore::NextOnce": 91,
    "client/tools/trainer_bench.cc:main": 103,
    "daemon/admin/admin_server.cc:AdminServer::Route": 82,
    "daemon/cache/cached_source.cc:CachedSource::ReadChunks": 146,
    "daemon/cache/io_reader.cc:IoReader::ReadBatch": 81,
    "daemon/cache/nvme_store.cc:NvmeStore::EnsureOpenSegment": 87,
    "daemon/cache/nvme_store.cc:NvmeStore::ReadPieces": 127,
    "daemon/cache/nvme_store.cc:NvmeStore::Recover": 123,
    "daemon/cache/nvme_store.cc:NvmeStore::StoreBatch": 130,
    "daemon/daemon.cc:Daemon::StatusJson": 86,
    "daemon/main.cc:main": 90,
    "daemon/serve/local_service.cc:LocalService::Serve": 184,
    "daemon/upstream/grpc_source.cc:GrpcSource::ReadChunks": 91,
    "daemon/upstream/grpc_source.cc:GrpcSource::RunTask": 158,
}

NOT_FUNCTIONS = re.compile(r"^(namespace|struct|class|enum|union|extern|template\s*<[^>]*>\s*(struct|class))\b")


def functions(path):
    """(name, first line, length) of every column-0 function definition in a .cc file."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace() and not line.startswith(("#", "//", "}")) and \
                not NOT_FUNCTIONS.match(line) and "(" in line:
            # The signature ends at the first line ending in "{" (a definition), ";" (not one) or
            # "}" (a one-line definition).
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith(("{", ";", "}")):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{") and "=" not in line.split("(")[0]:
                end = j + 1
                while end < len(lines) and not lines[end].startswith("}"):
                    end += 1
                name = re.sub(r"\s+", " ", line.split("(")[0]).split(" ")[-1]
                out.append((name, i + 1, end - j - 1))
                i = end
        i += 1
    return out


def main():
    list_all = "--list" in sys.argv[1:]
    problems, seen = [], set()
    for root in ROOTS:
        for dirpath, _, files in os.walk(os.path.join(SOURCE, root)):
            for f in sorted(files):
                if not f.endswith(".cc"):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, SOURCE)
                for name, line, length in functions(path):
                    if length <= LIMIT:
                        continue
                    key = f"{rel}:{name}"
                    if list_all:
                        print(f"{length:4d}  {rel}:{line}  {name}")
                    known = KNOWN.get(key)
                    seen.add(key)
                    if known is None:
                        problems.append(f"{rel}:{line}: {name} is {length} lines (limit {LIMIT}): split it")
                    elif length > known:
                        problems.append(f"{rel}:{line}: {name} grew to {length} lines (was {known}, "
                                        f"limit {LIMIT}): split it instead")
    for key in sorted(set(KNOWN) - seen):
        problems.append(f"{key} is no longer over {LIMIT} lines (or was renamed): remove it from KNOWN "
                        f"in {os.path.relpath(__file__, SOURCE)}")
    for p in problems:
        print(p, file=sys.stderr)
    if not list_all:
        print(f"function length: {len(problems)} problem(s); {len(KNOWN)} known long functions left to split")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
