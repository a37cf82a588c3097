#!/usr/bin/env python3
"""Keeps each workload's shardcache.io/config-hash annotation equal to the sha256 of the config
it mounts, so that applying a changed ConfigMap also changes the pod template and Kubernetes
rolls the pods (a ConfigMap change alone restarts nothing).

    python3 deploy/k8s/config_hash.py deploy/k8s/*.yaml           # rewrite the annotations
    python3 deploy/k8s/config_hash.py --check deploy/k8s/*.yaml   # exit 1 on a stale one

Only the annotation's line changes; comments and layout stay. Needs PyYAML (python3-yaml).
"""
import argparse
import hashlib
import re
import sys

import yaml

ANNOTATION = "shardcache.io/config-hash"
WORKLOADS = {"DaemonSet", "Deployment", "StatefulSet"}
LINE = re.compile(r'^(\s*' + re.escape(ANNOTATION) + r':\s*)"[^"]*"', re.MULTILINE)
SEPARATOR = re.compile(r"^---$", re.MULTILINE)


def config_hash(configmap):
    text = configmap["data"]["shardcached.toml"]
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def mounted_configmap(workload):
    for volume in workload["spec"]["template"]["spec"].get("volumes", []):
        if "configMap" in volume:
            return volume["configMap"]["name"]
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale annotations")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()

    texts = {path: open(path).read() for path in args.files}
    hashes = {}
    for text in texts.values():
        for doc in yaml.safe_load_all(text):
            if doc and doc["kind"] == "ConfigMap" and "shardcached.toml" in doc.get("data", {}):
                hashes[doc["metadata"]["name"]] = config_hash(doc)

    stale, unfixable = [], []
    for path, text in texts.items():
        chunks = SEPARATOR.split(text)
        for i, chunk in enumerate(chunks):
            doc = yaml.safe_load(chunk)
            if not doc or doc.get("kind") not in WORKLOADS:
                continue
            name = f'{path}: {doc["kind"]} {doc["metadata"]["name"]}'
            configmap = mounted_configmap(doc)
            if configmap not in hashes:
                unfixable.append(f"{name} mounts no shardcached.toml ConfigMap given here ({configmap})")
                continue
            have = doc["spec"]["template"]["metadata"].get("annotations", {}).get(ANNOTATION)
            if have is None:
                unfixable.append(f"{name} has no {ANNOTATION} annotation")
            elif have != hashes[configmap]:
                stale.append(f"{name}: {ANNOTATION} is {have}, the config's is {hashes[configmap]}")
                chunks[i] = LINE.sub(lambda m: f'{m.group(1)}"{hashes[configmap]}"', chunk)
        if not args.check:
            new = "---".join(chunks)
            if new != text:
                with open(path, "w") as f:
                    f.write(new)

    for line in unfixable:
        print(line, file=sys.stderr)
    for line in stale:
        print(line if args.check else "updated " + line, file=sys.stderr)
    return 1 if unfixable or (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
