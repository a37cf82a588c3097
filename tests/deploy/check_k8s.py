#!/usr/bin/env python3
"""Checks the Kubernetes manifests in deploy/k8s for the properties that keep a cluster safe and
its trainers fed. Run by k8s_manifests_test.cc:

    check_k8s.py SHARDCACHED DEPLOY_DIR

Prints one line per workload and exits 1 with every problem listed. Needs PyYAML.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

import yaml

WORKLOADS = {"DaemonSet", "Deployment", "StatefulSet"}
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
HEADROOM = 1 << 30  # working memory a limit must leave above the config's buffers


def quantity_bytes(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(q))
    if not m:
        raise ValueError(f"memory quantity {q!r} is not an integer with a binary suffix")
    return int(m.group(1)) * UNITS.get(m.group(2), 1)


class Checker:
    def __init__(self, shardcached, deploy_dir):
        self.shardcached = shardcached
        self.deploy_dir = deploy_dir
        self.problems = []
        self.docs = []
        for path in sorted(glob.glob(os.path.join(deploy_dir, "k8s", "*.yaml"))):
            for doc in yaml.safe_load_all(open(path)):
                if doc:
                    self.docs.append((os.path.basename(path), doc))
        self.configmaps = {d["metadata"]["name"]: d for _, d in self.docs if d["kind"] == "ConfigMap"}
        self.secrets = {d["metadata"]["name"]: d for f, d in self.docs
                        if d["kind"] == "Secret" and f == "secrets.example.yaml"}
        self.policies = [d for _, d in self.docs if d["kind"] == "NetworkPolicy"]

    def fail(self, where, what):
        self.problems.append(f"{where}: {what}")

    def check_config(self, where, pod, container, toml_text):
        """--check accepts the config (with the Secret files it names in place) and reports the
        buffer memory, which the container's memory limit must exceed."""
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        with tempfile.TemporaryDirectory() as tmp:
            text = toml_text
            for name, path in mounts.items():
                secret = volumes.get(name, {}).get("secret")  # claim templates are not pod volumes
                if not secret:
                    continue
                defined = self.secrets.get(secret["secretName"])
                if defined is None:
                    self.fail(where, f"Secret {secret['secretName']} is not in secrets.example.yaml")
                    continue
                keys = [i["key"] for i in secret.get("items", [])] or list(defined["stringData"])
                local = os.path.join(tmp, name)
                os.makedirs(local)
                for key in keys:
                    if key not in defined["stringData"]:
                        self.fail(where, f"Secret {secret['secretName']} has no key {key}")
                    with open(os.path.join(local, key), "w") as f:
                        f.write("placeholder\n")
                text = text.replace(path + "/", local + "/")
            for file_path in re.findall(r'"(/run/secrets/[^"]+)"', text):
                self.fail(where, f"config names {file_path}, which no Secret volume provides")
            cfg = os.path.join(tmp, "shardcached.toml")
            with open(cfg, "w") as f:
                f.write(text)
            run = subprocess.run([self.shardcached, "--check", "--config", cfg], capture_output=True, text=True)
        if run.returncode != 0:
            self.fail(where, f"shardcached --check refuses the ConfigMap: {run.stdout}{run.stderr}")
            return
        buffers = int(re.search(r"buffer memory: up to .* \((\d+) bytes\)", run.stdout).group(1))
        limit = quantity_bytes(container["resources"]["limits"]["memory"])
        if limit < buffers + HEADROOM:
            self.fail(where, f"memory limit {limit} B is below the config's buffers ({buffers} B) + 1 GiB")
        print(f"{where}: buffers {buffers >> 20} MiB, limit {limit >> 20} MiB")

    def admits_only_namespaces(self, labels, port):
        """A NetworkPolicy selects these pods and lets `port` in from namespaces only."""
        for p in self.policies:
            selector = p["spec"]["podSelector"].get("matchLabels", {})
            if not selector.items() <= labels.items() or "Ingress" not in p["spec"].get("policyTypes", []):
                continue
            rules = [r for r in p["spec"].get("ingress", [])
                     if any(x.get("port") == port for x in r.get("ports", []))]
            if rules and all(r.get("from") and all(set(src) == {"namespaceSelector"} for src in r["from"])
                             for r in rules):
                return True
        return False

    def check_workload(self, where, w):
        pod = w["spec"]["template"]["spec"]
        meta = w["spec"]["template"]["metadata"]
        container = next(c for c in pod["containers"] if c["name"] == "shardcached")
        context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
        if not context.get("runAsNonRoot") or context.get("runAsUser", 0) == 0:
            self.fail(where, "the daemon may run as root (runAsNonRoot / runAsUser)")
        if context.get("allowPrivilegeEscalation", True):
            self.fail(where, "allowPrivilegeEscalation is not false")
        if not container.get("startupProbe", {}).get("httpGet", {}).get("path", "").startswith("/ready"):
            self.fail(where, "no startupProbe on /ready")
        liveness = container.get("livenessProbe")
        if not liveness or liveness.get("initialDelaySeconds", 0) > 60:
            self.fail(where, "liveness missing, or delayed instead of waiting for the startupProbe")
        if "shardcache.io/config-hash" not in meta.get("annotations", {}):
            self.fail(where, "no shardcache.io/config-hash annotation on the pod template")
        cm_name = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
        toml_text = self.configmaps[cm_name]["data"]["shardcached.toml"]
        metrics = re.search(r'^metrics = "([^"]*)"', toml_text, re.M).group(1)
        if metrics and not metrics.startswith(("127.", "[::1]", "localhost")):
            port = int(metrics.rsplit(":", 1)[1])
            if not self.admits_only_namespaces(meta["labels"], port):
                self.fail(where, f"metrics on {metrics} without a NetworkPolicy admitting only namespaces")
        self.check_config(where, pod, container, toml_text)
        return toml_text

    def check_node_volumes(self, ds):
        """The cache and the socket directory are the host's, the latter shared with trainer pods."""
        pod = ds["spec"]["template"]["spec"]
        host = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        container = next(c for c in pod["containers"] if c["name"] == "shardcached")
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        for path in ("/run/shardcache", "/var/cache/shardcache"):
            if path not in host or path not in mounts:
                self.fail("daemonset.yaml", f"{path} is not a hostPath mounted into the daemon")

    def check_trainer_group(self, node_toml):
        """The node tier lets in the group the trainer pod example carries."""
        gids = re.search(r"^allowed_gids = \[([\d, ]+)\]", node_toml, re.M)
        header = open(os.path.join(self.deploy_dir, "k8s", "daemonset.yaml")).read()
        documented = re.search(r"supplementalGroups: \[(\d+)\]", header)
        if not gids or not documented or documented.group(1) not in gids.group(1).replace(" ", "").split(","):
            self.fail("daemonset.yaml", "the trainer pod's supplementalGroups is not in the config's allowed_gids")
        image_group = re.search(r"groupadd --system --gid (\d+) shardcache-users",
                                open(os.path.join(self.deploy_dir, "Dockerfile")).read())
        if not image_group or not documented or image_group.group(1) != documented.group(1):
            self.fail("Dockerfile", "shardcache-users in the image does not have the gid the manifests use")

    def check_peer_group(self, ds, node_toml):
        """[peers] dns names a headless Service of these manifests that selects the node pods on
        the port the daemon serves its share on (listen.origin), which the container declares,
        and only node pods may reach that port."""
        dns = re.search(r'^dns = "([^"]*)"', node_toml, re.M)
        if not dns or not dns.group(1):
            return  # no peer group: nodes fetch on their own
        host, _, port = dns.group(1).rpartition(":")
        origin = re.search(r'^origin = "[^"]*:(\d+)"', node_toml, re.M)
        if not origin or origin.group(1) != port:
            self.fail("daemonset.yaml", f"[peers] dns port {port} is not listen.origin's port")
        name, namespace = (host.split(".") + ["default"])[:2]
        labels = ds["spec"]["template"]["metadata"]["labels"]
        services = [d for _, d in self.docs if d["kind"] == "Service" and d["metadata"]["name"] == name
                    and d["metadata"].get("namespace", "default") == namespace]
        if not services:
            self.fail("daemonset.yaml", f"[peers] dns names Service {name}.{namespace}, which is not in deploy/k8s")
            return
        svc = services[0]["spec"]
        if svc.get("clusterIP") != "None":
            self.fail("daemonset.yaml", f"Service {name} is not headless: its name would resolve to one virtual IP")
        if not svc.get("selector") or not svc["selector"].items() <= labels.items():
            self.fail("daemonset.yaml", f"Service {name} does not select the node pods")
        container = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "shardcached")
        declared = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        target = [p.get("targetPort") for p in svc.get("ports", []) if str(p.get("port")) == port]
        if not target or declared.get(target[0], target[0]) != int(port):
            self.fail("daemonset.yaml", f"Service {name} port {port} does not reach the container's port {port}")
        peers_only = any(
            p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
            and any(any(x.get("port") == int(port) for x in r.get("ports", []))
                    and r.get("from") and all(src.get("podSelector", {}).get("matchLabels", {}).items() <= labels.items()
                                              and set(src) == {"podSelector"} for src in r["from"])
                    for r in p["spec"].get("ingress", []))
            for p in self.policies)
        if not peers_only:
            self.fail("daemonset.yaml", f"no NetworkPolicy limits the peer port {port} to node pods")
        print(f"daemonset.yaml: peer group through headless Service {name} on port {port}")

    def run(self):
        node_toml = None
        for f, d in self.docs:
            if d["kind"] in WORKLOADS:
                toml_text = self.check_workload(f"{f}: {d['kind']} {d['metadata']['name']}", d)
                if d["kind"] == "DaemonSet":
                    node_toml = toml_text
                    self.check_node_volumes(d)
                    self.check_peer_group(d, toml_text)
        if node_toml is None:
            self.fail("deploy/k8s", "no DaemonSet")
        else:
            self.check_trainer_group(node_toml)
        dockerfile = open(os.path.join(self.deploy_dir, "Dockerfile")).read()
        user = re.findall(r"^USER (\S+)", dockerfile, re.M)
        if not user or user[-1].split(":")[0] in ("0", "root"):
            self.fail("Dockerfile", "the image runs as root")
        dockerignore = os.path.join(self.deploy_dir, "..", ".dockerignore")
        ignored = open(dockerignore).read().split() if os.path.exists(dockerignore) else []
        for path in (".git", "build"):
            if path not in ignored:
                self.fail(".dockerignore", f"does not keep {path} out of the build context")
        hashes = subprocess.run([sys.executable, os.path.join(self.deploy_dir, "k8s", "config_hash.py"), "--check"]
                                + sorted(glob.glob(os.path.join(self.deploy_dir, "k8s", "*.yaml"))),
                                capture_output=True, text=True)
        if hashes.returncode != 0:
            self.fail("config_hash.py --check", hashes.stderr.strip())
        for p in self.problems:
            print("PROBLEM " + p)
        return 1 if self.problems else 0


if __name__ == "__main__":
    sys.exit(Checker(sys.argv[1], sys.argv[2]).run())
