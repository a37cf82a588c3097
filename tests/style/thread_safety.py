#!/usr/bin/env python3
"""Runs clang's thread-safety analysis over the project (issue 15).

  tests/style/thread_safety.py BUILD_DIR [-j JOBS] [-v] [FILE...]

Members marked GUARDED_BY(mu_) may only be touched with mu_ held, functions marked
REQUIRES(mu_) only called with it held (common/thread_annotations.h, common/mutex.h). gcc, which
builds the project, ignores the annotations; this check compiles each translation unit that
reaches common/thread_annotations.h (through its quoted includes) with clang++ -fsyntax-only
-Wthread-safety(-beta) -Werror, using the flags of BUILD_DIR/compile_commands.json, and
fails with clang's diagnostics when one does not hold. FILEs: check only these sources.

Sources checked: common/ daemon/ client/ gpu/ dataset/ objstore/ tools/ config/ python/src/, and the tests
that include common/mutex.h (.cu files, compiled by nvcc, hold no locks).

clang++: $CLANGXX, else clang++-14, else clang++ (deploy/setup.sh installs clang). JOBS: 2, or
$THREAD_SAFETY_JOBS."""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "../.."))
ROOTS = ("common", "daemon", "client", "gpu", "dataset", "objstore", "tools", "config", "python/src")
MARKER = os.path.join(SOURCE, "common", "thread_annotations.h")
# The analysis, as errors, with its beta checks (lock order from ACQUIRED_AFTER among them).
CHECK_FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Wthread-safety-beta", "-Werror=thread-safety",
               "-Werror=thread-safety-beta", "-Wno-unknown-warning-option"]
# Flags of the gcc build that clang has no use for here (or does not know).
DROP = re.compile(r"^(-W.*|-O.*|-g.*|-fdiagnostics-color.*|-fno-fat-lto-objects|-flto.*|-fconcepts.*"
                  r"|-fmax-errors=.*|-fno-semantic-interposition|-fstack-clash-protection)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def find_clang():
    for name in (os.environ.get("CLANGXX"), "clang++-14", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def clang_args(entry, clang):
    """The entry's compile flags for clang -fsyntax-only, and its include directories."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, incs = [clang], []
    i = 1
    while i < len(args):
        a = args[i]
        if a in ("-o", "-MF", "-MT", "-MQ"):
            i += 2
            continue
        if a in ("-c", "-MD", "-MMD") or a == entry["file"] or DROP.match(a):
            i += 1
            continue
        if a in ("-I", "-isystem", "-iquote", "-include", "-D", "-U", "-x"):
            out += [a, args[i + 1]]
            if a != "-D" and a != "-U" and a != "-x":
                incs.append(args[i + 1])
            i += 2
            continue
        if a.startswith("-I"):
            incs.append(a[2:])
        out.append(a)
        i += 1
    return out + CHECK_FLAGS + [entry["file"]], incs


def reaches_marker(path, incs, seen):
    """True when `path` includes common/thread_annotations.h through quoted includes."""
    if path in seen:
        return False
    seen.add(path)
    if os.path.realpath(path) == os.path.realpath(MARKER):
        return True
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    for inc in INCLUDE.findall(text):
        for d in [os.path.dirname(path)] + incs:
            cand = os.path.normpath(os.path.join(d, inc))
            if os.path.isfile(cand):
                if reaches_marker(cand, incs, seen):
                    return True
                break
    return False


def selected(entry):
    rel = os.path.relpath(entry["file"], SOURCE)
    if rel.startswith(".."):
        return False
    if any(rel.startswith(r + "/") for r in ROOTS):
        return True
    if rel.startswith("tests/"):
        with open(entry["file"], encoding="utf-8", errors="replace") as f:
            return '#include "common/mutex.h"' in f.read()
    return False


def run(cmd, directory):
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir")
    ap.add_argument("-j", "--jobs", type=int, default=int(os.environ.get("THREAD_SAFETY_JOBS", "2")))
    ap.add_argument("-v", "--verbose", action="store_true", help="print each file and its time")
    ap.add_argument("files", nargs="*", help="check only these sources")
    opts = ap.parse_args()

    clang = find_clang()
    if clang is None:
        print("thread_safety: FAILED: no clang++ (tried $CLANGXX, clang++-14, clang++). The check needs "
              "clang 14 or newer: run deploy/setup.sh (it installs `clang`), or set CLANGXX.")
        return 1
    db = os.path.join(opts.build_dir, "compile_commands.json")
    if not os.path.exists(db):
        print(f"thread_safety: FAILED: {db} is missing (CMAKE_EXPORT_COMPILE_COMMANDS is set in "
              "CMakeLists.txt; configure the build first)")
        return 1
    with open(db) as f:
        entries = json.load(f)

    only = {os.path.realpath(f) for f in opts.files}
    jobs, skipped = [], 0
    seen_files = set()
    for e in entries:
        args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        compiler = os.path.basename(args[0])
        if not re.search(r"(c\+\+|g\+\+|clang\+\+)", compiler) or not e["file"].endswith((".cc", ".cpp")):
            continue  # nvcc, C sources
        if e["file"] in seen_files or not selected(e):
            continue
        if only and os.path.realpath(e["file"]) not in only:
            continue
        seen_files.add(e["file"])
        cmd, incs = clang_args(e, clang)
        if not reaches_marker(e["file"], [os.path.join(e["directory"], d) for d in incs], set()):
            skipped += 1
            continue
        jobs.append((e["file"], cmd, e["directory"]))
    if not jobs:
        print("thread_safety: FAILED: no translation unit includes common/thread_annotations.h "
              f"(is {db} this checkout's?)")
        return 1

    t0 = time.monotonic()
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        futures = {pool.submit(run, cmd, d): path for path, cmd, d in jobs}
        for fut in concurrent.futures.as_completed(futures):
            path = futures[fut]
            rc, out, secs = fut.result()
            rel = os.path.relpath(path, SOURCE)
            if opts.verbose:
                print(f"  {secs:5.1f}s {rel}{'' if rc == 0 else '  FAILED'}", flush=True)
            if rc != 0:
                failures.append((rel, out))
    elapsed = time.monotonic() - t0
    for rel, out in sorted(failures):
        print(f"--- {rel}\n{out}")
    print(f"thread_safety: {len(jobs)} translation units checked with {os.path.basename(clang)} "
          f"({skipped} reach no annotations), {len(failures)} failed, {elapsed:.0f} s with {opts.jobs} jobs")
    if failures:
        print("thread_safety: FAILED: see the diagnostics above (common/thread_annotations.h says what "
              "each annotation means)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
