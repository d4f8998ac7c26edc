#!/usr/bin/env python3
"""deploy/kubernetes against the programs (ctest deploy.kubernetes).

Renders the kustomization with `kubectl kustomize` (offline) and checks the
objects' essentials against what the binaries expect: the flags each
container passes exist in that program's --help; ports agree between the
servers' --listen, the containers, the Services, the probes and the
coordinator's --stages pattern; that pattern names the stages' StatefulSet
and headless Service, in the namespace, with as many stages as it has
replicas; each stage asks for one GPU; the folders the flags name are the
mounted volumes (claims for state and checkpoints, Secrets for TLS and the
token); the pods run as the image's user. No cluster is involved: scheduling,
GPUs, DNS and the probes at run time are not tested. Exit 77: no kubectl.

    tests/deploy/kubernetes_test.py SOURCE_DIR BIN_DIR
"""
import os
import re
import shutil
import subprocess
import sys

import yaml

from deploy_checks import check, finish


def flags(command):
    """{--flag: value} of a container's command after the program's name."""
    out = {}
    words = command[1:]
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("--") and "=" in w:
            k, v = w.split("=", 1)
            out.setdefault(k, []).append(v)
        elif w.startswith("--"):
            out.setdefault(w, []).append(words[i + 1] if i + 1 < len(words) else "")
            i += 1
        i += 1
    return out


def known_flags(bin_dir, program):
    text = subprocess.run([os.path.join(bin_dir, program), "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"--[a-z][a-z0-9-]*", text))


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def mounts(container):
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def under(path, folder):
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def check_probe(container, port, name):
    for kind in ("readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if check(probe is not None, f"{name}: no {kind}"):
            cmd = probe.get("exec", {}).get("command")
            check(cmd == ["conveyor", "health", f"127.0.0.1:{port}"],
                  f"{name}: {kind} {cmd} is not `conveyor health 127.0.0.1:{port}` (grpc.health.v1 on its port)")


def check_tls(container, fl, secrets_at, name):
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    for flag, var in (("--tls-cert", "CONVEYOR_TLS_CERT"), ("--tls-key", "CONVEYOR_TLS_KEY"),
                      ("--tls-ca", "CONVEYOR_TLS_CA")):
        path = fl.get(flag, [None])[0]
        if check(path is not None, f"{name}: no {flag}"):
            check(any(under(path, m) for m in secrets_at), f"{name}: {flag} {path} is not in a mounted Secret")
            check(env.get(var) == path, f"{name}: {var}={env.get(var)} (the probes' TLS) differs from {flag} {path}")


def main():
    src, bin_dir = sys.argv[1], sys.argv[2]
    if not shutil.which("kubectl"):
        print("SKIPPED: no kubectl here (it renders the kustomization)")
        return 77
    rendered = subprocess.run(["kubectl", "kustomize", os.path.join(src, "deploy/kubernetes")],
                              capture_output=True, text=True)
    if rendered.returncode != 0:
        print("FAIL: kubectl kustomize deploy/kubernetes:\n" + rendered.stderr)
        return 1
    objs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(rendered.stdout) if o}
    ns = objs[("StatefulSet", "coordinator")]["metadata"].get("namespace")
    check(("Namespace", ns) in objs, f"the namespace {ns} is not created")

    uid = int(re.search(r"--uid (\d+)", open(os.path.join(src, "deploy/Dockerfile")).read()).group(1))
    programs = {}
    for (kind, name), o in objs.items():
        if kind != "StatefulSet":
            continue
        pod = o["spec"]["template"]["spec"]
        check(pod.get("securityContext", {}).get("runAsUser") == uid,
              f"{name}: runAsUser is not the images' user {uid} (deploy/Dockerfile)")
        check(o["spec"]["selector"]["matchLabels"].items() <= o["spec"]["template"]["metadata"]["labels"].items(),
              f"{name}: the selector does not match the pod's labels")
        for c in pod["containers"]:
            program = c["command"][0]
            if not check(os.access(os.path.join(bin_dir, program), os.X_OK), f"{name}: {program} is not a binary we build"):
                continue
            accepted = known_flags(bin_dir, program)
            for f in flags(c["command"]):
                check(f in accepted, f"{name}: {program} has no flag {f}")
            programs[program] = (o, c)

    def service_for(sts):
        for (kind, name), svc in objs.items():
            if kind == "Service" and svc["spec"].get("selector", {}).items() <= sts["spec"]["template"]["metadata"]["labels"].items():
                return svc
        return None

    # Stages.
    sts, c = programs["stage_server"]
    fl = flags(c["command"])
    port = port_of(fl["--listen"][0])
    check([p["containerPort"] for p in c["ports"]] == [port], f"stage: containerPort is not --listen's {port}")
    svc = objs.get(("Service", sts["spec"]["serviceName"]))
    if check(svc is not None, f"stage: no Service {sts['spec']['serviceName']} (serviceName)"):
        check(svc["spec"].get("clusterIP") == "None", "stage: its Service is not headless (stable pod names)")
        check(svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items(),
              "stage: the headless Service does not select the stage pods")
        check([p["port"] for p in svc["spec"]["ports"]] == [port], f"stage: the Service's port is not {port}")
    check(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") in (1, "1"), "stage: not one nvidia.com/gpu")
    check(fl.get("--device") == ["cuda:0"], "stage: --device is not cuda:0 (the pod's one GPU)")
    check_probe(c, port, "stage")
    m = mounts(c)
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    secrets = {v["name"]: v["secret"]["secretName"] for v in sts["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    check(m.get("checkpoints") == fl["--checkpoint-dir"][0] and "checkpoints" in claims,
          "stage: --checkpoint-dir is not the mounted claim `checkpoints`")
    check_tls(c, fl, [m[v] for v in secrets if v in m], "stage")
    stage_replicas = sts["spec"]["replicas"]
    stage_sts, stage_svc, stage_port = sts["metadata"]["name"], sts["spec"]["serviceName"], port

    # Coordinator.
    sts, c = programs["coordinator"]
    fl = flags(c["command"])
    port = port_of(fl["--listen"][0])
    check(sts["spec"]["replicas"] == 1, "coordinator: not a StatefulSet of one")
    check([p["containerPort"] for p in c["ports"]] == [port], f"coordinator: containerPort is not --listen's {port}")
    cli = service_for(sts)
    if check(cli is not None, "coordinator: no Service selects it (the CLI's way in)"):
        check([p["port"] for p in cli["spec"]["ports"]] == [port], f"coordinator: its Service's port is not {port}")
    check_probe(c, port, "coordinator")
    env = {e["name"]: e for e in c.get("env", [])}
    stages = fl["--stages"][0]
    if "$(POD_NAMESPACE)" in stages:
        check(env.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace",
              "coordinator: $(POD_NAMESPACE) in --stages without POD_NAMESPACE from metadata.namespace")
        stages = stages.replace("$(POD_NAMESPACE)", ns)
    want = f"{stage_sts}-{{0..{stage_replicas - 1}}}.{stage_svc}.{ns}.svc:{stage_port}"
    check(stages == want, f"coordinator: --stages {stages}, expected {want} (the StatefulSet's {stage_replicas} pods)")
    m = mounts(c)
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    check({"state", "checkpoints"} <= claims and {"state", "checkpoints"} <= m.keys(),
          "coordinator: no claims `state` and `checkpoints` mounted")
    check(m.get("state") == fl["--state-dir"][0], "coordinator: --state-dir is not the claim `state`")
    roots = fl.get("--data-root", [])
    check(any(under(m.get("checkpoints", "?"), r) for r in roots),
          "coordinator: the checkpoints volume is under no --data-root (jobs could not save there)")
    secrets = {v["name"]: v["secret"]["secretName"] for v in sts["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    check_tls(c, fl, [m[v] for v in secrets if v in m], "coordinator")
    token = fl.get("--auth-token-file", [""])[0]
    check(secrets.get("token") == "conveyor-token" and under(token, m.get("token", "?")),
          f"coordinator: --auth-token-file {token} is not in the mounted Secret conveyor-token")

    return finish(f"{len(objs)} objects; {stage_replicas} stages at {want}; coordinator on port {port}")


if __name__ == "__main__":
    sys.exit(main())
