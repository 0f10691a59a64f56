#!/usr/bin/python3
"""Check the Kubernetes manifests (deploy/kubernetes) against kvpoold itself.

Renders deploy/kubernetes, deploy/kubernetes/setup (a copy, with its
tokens file made from tokens.example) and deploy/kubernetes/etcd with
`kubectl kustomize`, then checks, failing on the first disagreement:

- setup/ holds the one Namespace and the tokens Secret (under a fixed
  name, the one the pods mount); the pool and etcd hold no Namespace (so
  `kubectl delete -k` of either leaves the namespace and its volumes),
  and everything is in that namespace;

- every --flag given to kvpoold is one `kvpoold --help` lists, and every
  KVPOOL_* variable of its container one it names;
- kvpoold's effective settings (`kvpoold --print-config` on the ConfigMap's
  kvpool.conf, with the container's arguments and environment) agree with
  the objects: the container and Service ports, the probes (path /healthz
  on the admin port), the Prometheus annotation, the memory limit (the
  arena, the room kvpoold keeps - srv_dram_headroom - and the index of a
  full NVMe tier - srv_nvme_index_bytes - as server/srv_memlimit.h and
  docs/configuration.md "Memory" say: kvpoold would warn otherwise), the
  CPU limit and threads, the NVMe tier on the pod's volume and its size,
  the tokens file where the init container puts it, node_name and
  advertise_address from the pod, the grace period against the drain
  times, the non-root user the image has, the image's tag (SRV_VERSION);
- the NetworkPolicy: the data port open, the admin port only to a
  selected namespace, nothing else;
- the Secret's tokens file and the ConfigMap's file are where kvpoold
  reads them;
- kvpoold, run the way the pod runs it (the init container's command
  makes its tokens file; the rendered kvpool.conf and environment; only
  ports, paths and the arena size moved to fit this machine), answers the
  probe path with 200 and refuses a client without a token (the shipped
  tokens file has none); the reload command of docs/operating.md ("Tokens
  on Kubernetes") then makes it accept a token added to the Secret,
  without a restart;
- the engine pod of docs/operating.md ("An engine pod"): the token from a
  mounted Secret file (token_file), never on the command line;
  PYTHONHASHSEED set; the URL naming every pool pod by its stable name and
  the data port, as libkvpool's own URL rule accepts it;
- the etcd variant: kvpool.conf's commented cluster line names the etcd
  Service of deploy/kubernetes/etcd; Debian's etcd, run with that
  manifest's flags, takes kvpoold's registration under the pod's name with
  the pod's address.

Run by tests/packaging/run.sh (make test-packaging).
"""

import argparse
import base64
import importlib.util
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


def render_setup(work):
    """deploy/kubernetes/setup rendered from a copy whose tokens file is
    tokens.example (an operator's real tokens, git-ignored, never read)."""
    dst = os.path.join(work, "setup")
    shutil.copytree(os.path.join(DEPLOY, "setup"), dst, ignore=shutil.ignore_patterns("tokens"))
    shutil.copy(os.path.join(dst, "tokens.example"), os.path.join(dst, "tokens"))
    return render(dst)


def srv_version():
    with open(os.path.join(ROOT, "server", "srv_server.h")) as f:
        return re.search(r'^#define SRV_VERSION "([^"]+)"', f.read(), re.M).group(1)


def memlimit_rule():
    """kvpoold's memory rule (server/srv_memlimit.h): index bytes per NVMe
    block and the smallest extent."""
    with open(os.path.join(ROOT, "server", "srv_memlimit.h")) as f:
        text = f.read()
    return (int(re.search(r"#define SRV_NVME_INDEX_BYTES_PER_BLOCK (\d+)u", text).group(1)),
            int(re.search(r"#define SRV_NVME_MIN_EXTENT (\d+)u", text).group(1)))


def operating_section(heading, fence):
    """The first ```fence block after `heading` in docs/operating.md."""
    with open(os.path.join(ROOT, "docs", "operating.md")) as f:
        text = f.read()
    at = text.find("\n" + heading + "\n")
    if at < 0:
        fail("docs/operating.md has no section %r" % heading)
    m = re.compile(r"^```%s\n(.*?)^```$" % fence, re.M | re.S).search(text, at)
    if not m:
        fail("docs/operating.md's %r has no ```%s block" % (heading, fence))
    return m.group(1)


def move_paths(script, mounts):
    """A container's shell command with its mount paths moved to local
    directories ({mountPath: dir}): one pass, longest path first."""
    pattern = "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))
    return re.sub(pattern, lambda m: mounts[m.group(0)], script)


def adapter_config():
    """The engine adapters' configuration rules (kvpool/_adapters/config.py),
    loaded on their own: no engine, no libkvpool."""
    path = os.path.join(ROOT, "client", "python", "kvpool", "_adapters", "config.py")
    spec = importlib.util.spec_from_file_location("kvpool_adapter_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_engine_pod(sts, svc, nsname, data_port):
    """docs/operating.md's engine pod: the token from a mounted Secret file,
    PYTHONHASHSEED, and a URL that names every pool pod the one way."""
    (dep,) = [d for d in yaml.safe_load_all(operating_section("### An engine pod", "yaml")) if d]
    (ct,) = dep["spec"]["template"]["spec"]["containers"]
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}
    env = {e["name"]: e for e in ct.get("env", [])}
    expect(re.fullmatch(r"\d+", str(env.get("PYTHONHASHSEED", {}).get("value", ""))),
           "the engine pod sets PYTHONHASHSEED to a fixed value (docs/engines.md)")
    secret_env = [n for n, e in env.items() if "secretKeyRef" in e.get("valueFrom", {})]
    args = " ".join(ct.get("args", []))
    expect(not any("$(%s)" % n in args for n in secret_env),
           "no Secret reaches the engine's command line through $(VAR)", str(secret_env))
    values = {n: e["value"] for n, e in env.items() if "value" in e}
    ktc = ct["args"][ct["args"].index("--kv-transfer-config") + 1]
    ktc = re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], ktc)
    tiers = [t for t in json.loads(ktc)["kv_connector_extra_config"]["secondary_tiers"]
             if t.get("type") == "kvpool"]
    expect(len(tiers) == 1, "the --kv-transfer-config has one kvpool tier")
    tier = tiers[0]
    expect("token" not in tier and tier.get("token_file"),
           "the tier takes its token from token_file %s, not from the command line" %
           tier.get("token_file"))
    mount = [m for m in ct.get("volumeMounts", []) if under(tier["token_file"], m["mountPath"])]
    expect(mount and "secret" in volumes.get(mount[0]["name"], {}),
           "token_file is in a mounted Secret (%s)" % (mount[0]["name"] if mount else None))
    url = tier["url"]
    adapter_config().url(url, "engine pod", "url")
    ok("the tier's url passes the adapters' own URL rule")
    want = ["%s-%d.%s.%s.svc.cluster.local:%d" % (sts["metadata"]["name"], i,
                                                   svc["metadata"]["name"], nsname, data_port)
            for i in range(sts["spec"]["replicas"])]
    expect(url == "tcp://" + ",".join(want),
           "the url names the %d pool pods by their stable names and the data port" % len(want), url)


def container_script(ct):
    """The SCRIPT of a container whose command is sh -c SCRIPT."""
    cmd = list(ct.get("command", [])) + list(ct.get("args", []))
    if len(cmd) != 3 or cmd[:2] != ["sh", "-c"]:
        fail("container %s does not run sh -c SCRIPT: %s" % (ct["name"], cmd))
    return cmd[2]


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

    work = tempfile.mkdtemp(prefix="kvpool-k8s-")
    docs = render(DEPLOY)
    setup_docs = render_setup(work)
    edocs = render(os.path.join(DEPLOY, "etcd"))

    # ---- the namespace: setup/ only; everything in it ----
    nsobj = one(setup_docs, "Namespace")
    nsname = nsobj["metadata"]["name"]
    ok("setup/ has the Namespace %s" % nsname)
    for name, group in (("deploy/kubernetes", docs), ("deploy/kubernetes/etcd", edocs)):
        expect(not any(d["kind"] == "Namespace" for d in group),
               "%s has no Namespace (kubectl delete -k leaves the namespace, its volumes, etcd)" %
               name)
    for d in docs + edocs + [d for d in setup_docs if d is not nsobj]:
        expect(d["metadata"].get("namespace") == nsname,
               "%s %s is in the namespace %s" % (d["kind"], d["metadata"]["name"], nsname))

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
        per_block, extent = memlimit_rule()
        nvme_index = size(conf["nvme_capacity"]) // extent * per_block if conf.get("nvme_dir") else 0
        expect(limit - dram - headroom >= nvme_index,
               "and the index of a full NVMe tier: nvme_capacity %s / %d x %d bytes = %d bytes "
               "(kvpoold would warn at start otherwise)" % (conf["nvme_capacity"], extent, per_block,
                                                             nvme_index),
               "%d bytes left" % (limit - dram - headroom))
        expect(limit - dram - headroom - nvme_index < 1 << 30,
               "and not 1GiB more than that (the pod is sized by the rule)",
               "%d bytes more" % (limit - dram - headroom - nvme_index))
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
        expect(not any(d["kind"] == "Secret" for d in docs),
               "the pool's kustomization makes no Secret (setup/ does)")
        secret = one(setup_docs, "Secret", secret_vol["secret"]["secretName"])
        ok("setup/'s Secret is named %s, with no hash suffix, as the pods mount it" %
           secret["metadata"]["name"])
        (skey,) = list(secret["data"])
        tokens_text = base64.b64decode(secret["data"][skey]).decode()
        src = [mount_of(i, secret_vol["name"]) for i in inits if mount_of(i, secret_vol["name"])]
        expect(src and "%s/%s" % (src[0], skey) in init_cmd and tokens_file in init_cmd and
               "0600" in init_cmd, "the init container copies the Secret's %s to %s with mode 0600" %
               (skey, tokens_file))
        run_vol = next(m["name"] for m in c["volumeMounts"] if under(tokens_file, m["mountPath"]))
        expect(any(mount_of(i, run_vol) for i in inits),
               "tokens_file's volume %s is shared with the init container" % run_vol)
        # the reload path: the Secret and a writable tokens_file directory in kvpoold's container
        run_mount = next(m for m in c["volumeMounts"] if m["name"] == run_vol)
        expect(mount_of(c, secret_vol["name"]) and not run_mount.get("readOnly"),
               "kvpoold's container mounts the Secret (%s) and %s writable, for a reload" %
               (mount_of(c, secret_vol["name"]), run_mount["mountPath"]))
        reload_sh = re.search(r"sh -c '([^']*)'", operating_section("### Tokens on Kubernetes", "sh"))
        expect(reload_sh and "kill -HUP 1" in reload_sh.group(1) and
               "%s/%s" % (mount_of(c, secret_vol["name"]), skey) in reload_sh.group(1) and
               tokens_file in reload_sh.group(1),
               "docs/operating.md's reload command copies %s/%s to %s and sends SIGHUP to kvpoold" %
               (mount_of(c, secret_vol["name"]), skey, tokens_file))

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

        # ---- the image: kvpool's version ----
        with open(os.path.join(DEPLOY, "kustomization.yaml")) as f:
            kimg = next(i for i in yaml.safe_load(f)["images"] if i["name"] == "kvpool")
        version = srv_version()
        expect(str(kimg.get("newTag")) == version,
               "the image's tag is kvpool's version %s (kustomization.yaml images: newTag)" % version,
               "newTag %r: set it to SRV_VERSION" % kimg.get("newTag"))
        for ct in spec["containers"] + inits:
            expect(ct["image"] == "%s:%s" % (kimg["newName"], version),
                   "container %s runs %s:%s" % (ct["name"], kimg["newName"], version), ct["image"])

        # ---- the NetworkPolicy ----
        npol = one(docs, "NetworkPolicy")
        expect(all(labels.get(k) == v for k, v in npol["spec"]["podSelector"]["matchLabels"].items())
               and "Ingress" in npol["spec"].get("policyTypes", []),
               "a NetworkPolicy governs the pool pods' ingress")
        by_number = {v: k for k, v in ports.items()}
        open_to_all, restricted = set(), set()
        for rule in npol["spec"].get("ingress", []):
            named = {by_number.get(pp["port"], pp["port"]) for pp in rule.get("ports", [])}
            expect(named, "every ingress rule names its ports", str(rule))
            if rule.get("from"):
                expect(all("namespaceSelector" in f or "podSelector" in f for f in rule["from"]),
                       "ports %s: only from selected namespaces or pods" % sorted(named))
                restricted |= named
            else:
                open_to_all |= named
        expect(open_to_all == {"data"}, "only the data port is open to every pod (clients need tokens)",
               str(sorted(open_to_all)))
        expect(restricted == {"admin"}, "the admin port (no authentication) only to a selected "
               "namespace", str(sorted(restricted)))

        # ---- kvpoold run the way the pod runs it ----
        # the init container's command, its mounts moved to local directories
        port, admin = free_ports(2)
        local = {}
        for v in spec["volumes"]:
            local[v["name"]] = os.path.join(work, "vol-" + v["name"])
            os.mkdir(local[v["name"]])
        with open(os.path.join(local[secret_vol["name"]], skey), "w") as f:
            f.write(tokens_text)
        for vct_name in vct:
            local[vct_name] = os.path.join(work, "vol-" + vct_name)
            os.makedirs(local[vct_name], exist_ok=True)
        init = next(i for i in inits if tokens_file in container_script(i))
        r = subprocess.run(["sh", "-c", move_paths(container_script(init),
                                              {m["mountPath"]: local[m["name"]]
                                               for m in init["volumeMounts"]})],
                           capture_output=True, text=True)
        expect(r.returncode == 0, "the init container's command runs", r.stderr)
        main_mounts = {m["mountPath"]: local[m["name"]] for m in c["volumeMounts"]
                       if m["name"] in local}
        tokens = move_paths(tokens_file, main_mounts)
        nvme = move_paths(nvme_dir, main_mounts)
        expect(os.path.isdir(nvme) and os.stat(tokens).st_mode & 0o777 == 0o600,
               "it made nvme_dir and tokens_file (mode 0600) where kvpoold's container sees them")
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

        # a token added to the Secret (as the kubelet updates the mounted
        # copy), then docs/operating.md's reload command in the container
        token = os.urandom(16).hex()
        with open(os.path.join(local[secret_vol["name"]], skey), "a") as f:
            f.write("%s rw pkgtest:\n" % token)
        payload = os.path.join(work, "payload")
        with open(payload, "wb") as f:
            f.write(b"kvpool" * 100)

        def put_with_token():
            return subprocess.run([opts.kvpool, "put", "--server", "tcp://127.0.0.1:%d" % port,
                                   "--namespace", "pkgtest:k8s", "text:reload", payload],
                                  capture_output=True, text=True,
                                  env=dict(os.environ, KVPOOL_TOKEN=token))
        r = put_with_token()
        expect(r.returncode != 0, "the new token is refused before the reload", r.stdout + r.stderr)
        cmd = move_paths(reload_sh.group(1), main_mounts).replace("kill -HUP 1", "kill -HUP %d" % p.pid)
        r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)
        expect(r.returncode == 0, "the reload command runs", r.stderr)
        wait_for(lambda: put_with_token().returncode == 0, 10, "the new token is accepted")
        expect(p.poll() is None and os.stat(tokens).st_mode & 0o777 == 0o600,
               "after the reload the new token is accepted by the same kvpoold (no restart), "
               "its tokens file still mode 0600")
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=grace)
        expect(rc == 0, "and it stops with exit 0 on SIGTERM within the grace period", str(rc))

        # ---- the engine pod of docs/operating.md ----
        check_engine_pod(sts, svc, nsname, ports["data"])

        # ---- etcd membership: the commented cluster line, the etcd manifests ----
        m = re.search(r"^#\s*cluster\s*=\s*(etcd://([^:/]+):(\d+)/(\S+))", cm["data"][key], re.M)
        expect(m, "kvpool.conf has a commented cluster = etcd://... line")
        cluster_url, etcd_host, etcd_port, cluster_name = m.groups()
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
        # etcd decides where engines send blocks and tokens: a NetworkPolicy
        # lets only the pool's pods and selected namespaces reach it
        enpol = one(edocs, "NetworkPolicy")
        elabels = ests["spec"]["template"]["metadata"]["labels"]
        expect(all(elabels.get(k) == v for k, v in enpol["spec"]["podSelector"]["matchLabels"].items())
               and "Ingress" in enpol["spec"].get("policyTypes", []),
               "a NetworkPolicy governs the etcd pod's ingress")
        erules = enpol["spec"].get("ingress", [])
        expect(erules and all(r.get("from") for r in erules),
               "every etcd ingress rule has a from: (no port open to every pod)", str(erules))
        for r in erules:
            for f in r["from"]:
                expect(("podSelector" in f and "namespaceSelector" not in f and
                        all(labels.get(k) == v for k, v in f["podSelector"]["matchLabels"].items()))
                       or ("namespaceSelector" in f and "podSelector" not in f and
                           f["namespaceSelector"].get("matchLabels")),
                       "etcd is reached from the pool's pods or from labelled namespaces only", str(f))
        expect(any(f.get("podSelector") for r in erules for f in r["from"]),
               "the pool's pods reach etcd (they register there)")
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
