#!/usr/bin/python3
"""Check the Kubernetes manifests (deploy/kubernetes) against kvpoold itself.

Renders deploy/kubernetes and deploy/kubernetes/etcd with `kubectl
kustomize`, then checks, failing on the first disagreement:

- every --flag given to kvpoold is one `kvpoold --help` lists, and every
  KVPOOL_* variable of its container one it names;
- kvpoold's effective settings (`kvpoold --print-config` on the ConfigMap's
  kvpool.conf, with the container's arguments and environment) agree with
  the objects: the container and Service ports, the probes (path /healthz
  on the admin port), the Prometheus annotation, the memory limit (the
  arena plus the room kvpoold keeps, srv_dram_headroom in
  server/srv_memlimit.c), the CPU limit and threads, the NVMe tier on the
  pod's volume and its size, the tokens file where the init container puts
  it, node_name and advertise_address from the pod, the grace period
  against the drain times, the non-root user the image has;
- the Secret's tokens file and the ConfigMap's file are where kvpoold
  reads them;
- kvpoold, run the way the pod runs it (the rendered kvpool.conf and
  environment; only ports, paths and the arena size moved to fit this
  machine), answers the probe path with 200 and refuses a client without a
  token (the shipped tokens file has none);
- the etcd variant: kvpool.conf's commented cluster line names the etcd
  Service of deploy/kubernetes/etcd; Debian's etcd, run with that
  manifest's flags, takes kvpoold's registration under the pod's name with
  the pod's address.

Run by tests/packaging/run.sh (make test-packaging).
"""

import argparse
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
UNITS = {"B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
         "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4}
K8S_UNITS = {"": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
             "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}

checks = 0


def ok(what):
    global checks
    checks += 1
    print("ok    " + what)


def fail(what):
    print("FAIL  " + what)
    sys.exit(1)


def expect(cond, what, detail=""):
    if not cond:
        fail(what + (": " + detail if detail else ""))
    ok(what)


def k8s_bytes(q):
    m = re.fullmatch(r"(\d+)([KMGT]i?)?", str(q))
    if not m:
        fail("cannot read the quantity %r" % q)
    return int(m.group(1)) * K8S_UNITS[m.group(2) or ""]


def k8s_cpu(q):
    q = str(q)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def render(path):
    r = subprocess.run(["kubectl", "kustomize", path], capture_output=True, text=True)
    if r.returncode != 0:
        fail("kubectl kustomize %s: %s" % (path, r.stderr.strip()))
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    if len(found) != 1:
        fail("expected one %s%s, found %d" % (kind, " " + name if name else "", len(found)))
    return found[0]


def free_ports(n):
    ss = [socket.socket() for _ in range(n)]
    for s in ss:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in ss]
    for s in ss:
        s.close()
    return ports


def help_vocabulary(kvpoold):
    text = subprocess.run([kvpoold, "--help"], capture_output=True, text=True, check=True).stdout
    flags = set(re.findall(r"^  (--[a-z0-9-]+)", text, re.M))
    variables = set(re.findall(r"\b(KVPOOL_[A-Z0-9_]+)\b", text))
    if len(flags) < 20 or not variables:
        fail("kvpoold --help lists %d flags and %d variables: not the help expected" %
             (len(flags), len(variables)))
    return flags, variables


def print_config(kvpoold, args, env):
    r = subprocess.run([kvpoold, "--print-config"] + args, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        fail("kvpoold --print-config %s: %s" % (" ".join(args), r.stderr.strip()))
    conf = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition(" ")
        conf[key] = value
    return conf


def size(value):
    m = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]*)", value.strip())
    if not m:
        fail("cannot read the size %r" % value)
    return int(float(m.group(1)) * UNITS[m.group(2).upper() or "B"])


def env_of(container, pod_name, pod_ip):
    """The container's KVPOOL_* environment as a pod would have it."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        else:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            env[e["name"]] = {"metadata.name": pod_name, "status.podIP": pod_ip}[path]
    return env


def mount_of(container, volume):
    for m in container.get("volumeMounts", []):
        if m["name"] == volume:
            return m["mountPath"]
    return None


def under(path, directory):
    return directory is not None and (path == directory or path.startswith(directory.rstrip("/") + "/"))


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_for(fn, seconds, what):
    deadline = time.time() + seconds
    last = None
    while time.time() < deadline:
        try:
            v = fn()
            if v:
                return v
        except (OSError, ValueError) as e:
            last = e
        time.sleep(0.1)
    fail("%s within %d s (%s)" % (what, seconds, last))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpoold", required=True)
    ap.add_argument("--kvpool", required=True)
    opts = ap.parse_args()
    kvpoold = os.path.abspath(opts.kvpoold)
    flags, variables = help_vocabulary(kvpoold)

    docs = render(DEPLOY)
    sts = one(docs, "StatefulSet", "kvpool")
    pod = sts["spec"]["template"]
    spec = pod["spec"]
    main_c = [c for c in spec["containers"] if c["name"] == "kvpoold"]
    expect(len(main_c) == 1, "the StatefulSet has a kvpoold container")
    c = main_c[0]

    # ---- flags and variables: the ones kvpoold knows ----
    args = list(c.get("command", [])) + list(c.get("args", []))
    expect(args and args[0] == "kvpoold", "the container runs kvpoold (through the image's entrypoint)",
           str(args))
    args = args[1:]
    for a in args:
        if a.startswith("--"):
            expect(a.split("=", 1)[0] in flags, "flag %s is one kvpoold --help lists" % a.split("=", 1)[0])
    for e in c.get("env", []):
        if e["name"].startswith("KVPOOL_"):
            expect(e["name"] in variables, "variable %s is one kvpoold --help names" % e["name"])

    # ---- the ConfigMap's kvpool.conf is the file --config names ----
    cm_name = next(v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v)
    cm = one(docs, "ConfigMap", cm_name)
    cm_vol = next(v["name"] for v in spec["volumes"] if v.get("configMap", {}).get("name") == cm_name)
    conf_path = args[args.index("--config") + 1]
    key = os.path.basename(conf_path)
    expect(key in cm["data"] and os.path.dirname(conf_path) == mount_of(c, cm_vol),
           "--config %s is the ConfigMap %s's %s, mounted at %s" % (conf_path, cm_name, key,
                                                                  mount_of(c, cm_vol)))

    work = tempfile.mkdtemp(prefix="kvpool-k8s-")
    procs = []
    try:
        conf_file = os.path.join(work, key)
        with open(conf_file, "w") as f:
            f.write(cm["data"][key])
        pod_env = env_of(c, "kvpool-0", "10.1.2.3")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
        env.update(pod_env)
        real_args = [conf_file if a == conf_path else a for a in args]
        conf = print_config(kvpoold, real_args, env)
        ok("kvpoold --print-config accepts the rendered kvpool.conf, flags and environment")

        # ---- ports ----
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        expect(ports.get("data") == int(conf["port"]), "container port data = port %s" % conf["port"])
        expect(ports.get("admin") == int(conf["admin_port"]),
               "container port admin = admin_port %s" % conf["admin_port"])
        expect(conf["listen"] in ("0.0.0.0", "::"), "kvpoold listens on every interface of the pod",
               conf["listen"])
        svc = one(docs, "Service", sts["spec"]["serviceName"])
        expect(svc["spec"].get("clusterIP") == "None", "serviceName %s is a headless Service" %
               svc["metadata"]["name"])
        labels = pod["metadata"]["labels"]
        expect(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
               "the Service selects the pods")
        for sp in svc["spec"]["ports"]:
            target = sp["targetPort"]
            expect(target in ports and sp["port"] == ports[target],
                   "Service port %s -> %s (%s)" % (sp["name"], target, ports.get(target)))
        ann = pod["metadata"].get("annotations", {})
        expect(ann.get("prometheus.io/port") == conf["admin_port"], "Prometheus scrapes admin_port")
        pdb = one(docs, "PodDisruptionBudget")
        expect(all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items()),
               "the PodDisruptionBudget selects the pods")

        # ---- probes: /healthz on the admin port ----
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            g = c.get(probe, {}).get("httpGet")
            expect(g is not None and g["path"] == "/healthz" and
                   (g["port"] == "admin" or g["port"] == int(conf["admin_port"])),
                   "%s: GET /healthz on the admin port" % probe, str(g))

        # ---- resources from dram_capacity and threads ----
        res = c["resources"]
        limit = k8s_bytes(res["limits"]["memory"])
        dram = size(conf["dram_capacity"])
        headroom = (64 << 20) + limit // 32  # srv_dram_headroom (server/srv_memlimit.c)
        expect(limit - dram >= headroom,
               "memory limit %s holds dram_capacity %d + kvpoold's headroom %d" %
               (res["limits"]["memory"], dram, headroom))
        expect(limit - dram - headroom >= 256 << 20,
               "and leaves at least 256MiB for the index and buffers",
               "%d bytes" % (limit - dram - headroom))
        expect(res["requests"]["memory"] == res["limits"]["memory"], "memory request = limit")
        threads = int(conf["threads"])
        cpus = k8s_cpu(res["limits"]["cpu"])
        expect(threads >= 1 and threads <= max(1, cpus),
               "threads %d set and within the CPU limit %s" % (threads, res["limits"]["cpu"]))

        # ---- NVMe tier on the pod's volume ----
        vct = {t["metadata"]["name"]: t for t in sts["spec"].get("volumeClaimTemplates", [])}
        nvme_dir = conf.get("nvme_dir", "")
        data_vol = next((n for n in vct if under(nvme_dir, mount_of(c, n))), None)
        expect(nvme_dir and data_vol, "nvme_dir %s is on a volumeClaimTemplate" % nvme_dir)
        claim = k8s_bytes(vct[data_vol]["spec"]["resources"]["requests"]["storage"])
        expect(claim >= size(conf["nvme_capacity"]) * 1.05,
               "its claim %d bytes holds nvme_capacity %s with room for the index" %
               (claim, conf["nvme_capacity"]))
        inits = spec.get("initContainers", [])
        init_cmd = " ".join(" ".join(i.get("command", []) + i.get("args", [])) for i in inits)
        expect(nvme_dir in init_cmd and any(under(nvme_dir, mount_of(i, data_vol)) for i in inits),
               "an init container creates nvme_dir on that volume")

        # ---- the tokens file: Secret -> init container -> tokens_file ----
        tokens_file = conf.get("tokens_file", "")
        expect(tokens_file, "tokens_file is set (protected mode needs it on 0.0.0.0)")
        secret_vol = next(v for v in spec["volumes"] if "secret" in v)
        secret = one(docs, "Secret", secret_vol["secret"]["secretName"])
        (skey,) = list(secret["data"])
        tokens_text = base64.b64decode(secret["data"][skey]).decode()
        src = [mount_of(i, secret_vol["name"]) for i in inits if mount_of(i, secret_vol["name"])]
        expect(src and "%s/%s" % (src[0], skey) in init_cmd and tokens_file in init_cmd and
               "0600" in init_cmd, "the init container copies the Secret's %s to %s with mode 0600" %
               (skey, tokens_file))
        run_vol = next(m["name"] for m in c["volumeMounts"] if under(tokens_file, m["mountPath"]))
        expect(any(mount_of(i, run_vol) for i in inits),
               "tokens_file's volume %s is shared with the init container" % run_vol)

        # ---- the pod's identity ----
        expect(conf.get("node_name") == "kvpool-0", "node_name is the pod's name", conf.get("node_name"))
        expect(conf.get("advertise_address") == "10.1.2.3", "advertise_address is the pod's IP",
               conf.get("advertise_address"))
        grace = spec.get("terminationGracePeriodSeconds", 30)
        drain_s = (int(conf["drain_timeout_ms"]) + int(conf["nvme_drain_ms"])) / 1000
        expect(grace >= drain_s + 10, "terminationGracePeriodSeconds %d > drain_timeout_ms + nvme_drain_ms"
               " (%g s) + 10 s" % (grace, drain_s))

        # ---- non-root, the image's own user ----
        sc = spec["securityContext"]
        with open(os.path.join(ROOT, "docker", "Dockerfile")) as f:
            m = re.search(r"useradd --uid (\d+)", f.read())
        expect(sc.get("runAsNonRoot") is True and m and sc.get("runAsUser") == int(m.group(1)),
               "pods run as non-root uid %s, the image's kvpool user" % sc.get("runAsUser"))
        for ct in spec["containers"] + inits:
            csc = ct.get("securityContext", {})
            expect(csc.get("allowPrivilegeEscalation") is False and csc.get("readOnlyRootFilesystem"),
                   "container %s: no privilege escalation, read-only root" % ct["name"])

        # ---- kvpoold run the way the pod runs it ----
        port, admin = free_ports(2)
        tokens = os.path.join(work, "tokens")
        with open(tokens, "w") as f:
            f.write(tokens_text)
        os.chmod(tokens, 0o600)
        nvme = os.path.join(work, "nvme")
        os.mkdir(nvme)
        log = open(os.path.join(work, "kvpoold.log"), "w")
        p = subprocess.Popen([kvpoold] + real_args +
                             ["--port", str(port), "--admin-port", str(admin), "--dram-capacity", "64MiB",
                              "--nvme-dir", nvme, "--nvme-capacity", "256MiB", "--tokens-file", tokens,
                              "--threads", "1"], env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(p)
        path = c["readinessProbe"]["httpGet"]["path"]
        status = wait_for(lambda: http_get("http://127.0.0.1:%d%s" % (admin, path))[0] == 200, 30,
                          "kvpoold answers 200 on %s" % path)
        expect(status, "kvpoold with the rendered settings answers 200 on %s" % path)
        r = subprocess.run([opts.kvpool, "put", "--server", "tcp://127.0.0.1:%d" % port, "text:x",
                            "/dev/null"], capture_output=True, text=True)
        expect(r.returncode != 0 and "token" in (r.stdout + r.stderr).lower(),
               "the shipped tokens file refuses a client without a token", r.stdout + r.stderr)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=grace)
        expect(rc == 0, "and it stops with exit 0 on SIGTERM within the grace period", str(rc))

        # ---- etcd membership: the commented cluster line, the etcd manifests ----
        m = re.search(r"^#\s*cluster\s*=\s*(etcd://([^:/]+):(\d+)/(\S+))", cm["data"][key], re.M)
        expect(m, "kvpool.conf has a commented cluster = etcd://... line")
        cluster_url, etcd_host, etcd_port, cluster_name = m.groups()
        edocs = render(os.path.join(DEPLOY, "etcd"))
        esvc = one(edocs, "Service", etcd_host)
        expect(any(sp["port"] == int(etcd_port) for sp in esvc["spec"]["ports"]),
               "its host and port are the etcd Service %s:%s" % (etcd_host, etcd_port))
        ests = one(edocs, "StatefulSet")
        expect(all(ests["spec"]["template"]["metadata"]["labels"].get(k) == v
                   for k, v in esvc["spec"]["selector"].items()), "the etcd Service selects etcd's pod")
        expect(not any(labels.get(k) != v for k, v in svc["spec"]["selector"].items()) and
               any(ests["spec"]["template"]["metadata"]["labels"].get(k) != v
                   for k, v in svc["spec"]["selector"].items()),
               "the pool's Service does not select etcd's pod")
        econ = ests["spec"]["template"]["spec"]["containers"][0]
        eargs = econ.get("command", []) + econ.get("args", [])
        etcd_bin = shutil.which("etcd")
        if not etcd_bin:
            fail("Debian's etcd (etcd-server) is not installed: make deps")
        ehelp = subprocess.run([etcd_bin, "--help"], capture_output=True, text=True).stdout
        for a in eargs[1:]:
            name = a.split("=", 1)[0]
            expect(re.search(r"^\s*%s\b" % re.escape(name), ehelp, re.M),
                   "etcd flag %s is one Debian's etcd --help lists" % name)

        # Debian's etcd with the manifest's flags (ports and directories
        # moved), kvpoold with the cluster line: the pod's registration.
        cport, pport, port, admin = free_ports(4)
        moved = []
        for a in eargs[1:]:
            a = a.replace(":2379", ":%d" % cport).replace(":2380", ":%d" % pport)
            a = a.replace("0.0.0.0", "127.0.0.1").replace("http://%s:" % etcd_host, "http://127.0.0.1:")
            if a.startswith("--data-dir="):
                a = "--data-dir=" + os.path.join(work, "etcd")
            moved.append(a)
        elog = open(os.path.join(work, "etcd.log"), "w")
        e = subprocess.Popen([etcd_bin] + moved, stdout=elog, stderr=subprocess.STDOUT)
        procs.append(e)
        epath = econ["readinessProbe"]["httpGet"]["path"]
        wait_for(lambda: http_get("http://127.0.0.1:%d%s" % (cport, epath))[0] == 200, 30,
                 "etcd answers on %s" % epath)
        ok("Debian's etcd runs with the manifest's flags and answers its probe path %s" % epath)
        env2 = dict(env)
        env2["KVPOOL_CLUSTER"] = cluster_url.replace("%s:%s" % (etcd_host, etcd_port),
                                                     "127.0.0.1:%d" % cport)
        env2["KVPOOL_ADVERTISE_ADDRESS"] = "127.0.0.1"
        p = subprocess.Popen([kvpoold] + real_args +
                             ["--listen", "127.0.0.1", "--port", str(port), "--admin-port", str(admin),
                              "--dram-capacity", "64MiB", "--nvme-dir", nvme, "--nvme-capacity", "256MiB",
                              "--tokens-file", tokens, "--threads", "1"],
                             env=env2, stdout=log, stderr=subprocess.STDOUT)
        procs.append(p)
        node_key = "kvpool/%s/nodes/kvpool-0" % cluster_name

        def registered():
            body = json.dumps({"key": base64.b64encode(node_key.encode()).decode()}).encode()
            req = urllib.request.Request("http://127.0.0.1:%d/v3/kv/range" % cport, data=body)
            with urllib.request.urlopen(req, timeout=2) as r:
                kvs = json.load(r).get("kvs", [])
            return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None

        rec = wait_for(registered, 30, "kvpoold registers %s in etcd" % node_key)
        expect(rec.get("name") == "kvpool-0" and rec.get("address") == "127.0.0.1" and
               rec.get("port") == port, "kvpoold registered as %s with the pod's address" % node_key,
               json.dumps(rec))
        p.send_signal(signal.SIGTERM)
        expect(p.wait(timeout=grace) == 0, "it stops with exit 0 and deregisters")
        expect(registered() is None, "its record is gone from etcd")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
    print("k8s_check: %d checks passed" % checks)


if __name__ == "__main__":
    main()
