"""The deploy kit (``deploy/``) matches the code it deploys, and never starts a node open.

Every check reads the real thing: ``pagesift serve`` flags go through the real parser,
config keys through ``ServerConfig``, metric names against a real ``Metrics``
exposition, manifests through the Kubernetes schemas (kubernetes-validate, strict), the
Dockerfile through hadolint, the alert rules through promtool (``check rules`` and the
unit tests in ``deploy/prometheus/pagesift-alerts.test.yaml``), the systemd units
through ``systemd-analyze verify``, the compose etcd-auth command through the real
``pagesift.coord.etcdauth`` parser. One end-to-end test runs a primary and a standby
from the example config over TLS and asks them through ``deploy/healthcheck.py``; another
starts compose's three etcd members (their own flags, on loopback), runs compose's
etcd-auth command against them and takes the lease as a compose node logs in.

promtool is required (Debian: ``apt-get install -y --no-install-recommends prometheus``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, fields
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pagesift.cli import build_parser
from pagesift.cli.serve import serve_overrides
from pagesift.coord import etcdauth, keys
from pagesift.coord.etcd import EtcdUnavailable
from pagesift.coord.witness import EtcdWitness, Lease
from pagesift.core.api.metrics import Metrics
from pagesift.core.api.metricsources import (
    ReplicationFigures,
    ScrapeSources,
    StorageFigures,
    WitnessGauges,
)
from pagesift.core.config.schema import ServerConfig
from pagesift.core.config.settings import load_config
from pagesift.core.ha.election import MIN_TTL, Holder, parse_witness
from pagesift.core.jobs.accounts import Accounts, AccountsError, hash_key, new_key
from pagesift.core.store.db import Store
from pagesift.core.util.children import Child
from pagesift.gateway.metrics import GatewayMetrics
from tests.helpers import free_port, start_server_process

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
VENV_BIN = Path(sys.executable).parent
HOST_CONFIG = "/etc/pagesift/pagesift.toml"  # where the image and the units read the config
HEALTHCHECK = "/opt/pagesift/healthcheck.py"  # where the image puts deploy/healthcheck.py
K8S_VERSIONS = ("1.30.0", "1.37.0")  # the oldest and newest Kubernetes the kit targets
# The witness's series the alerts and the dashboard rely on.
WITNESS_METRICS = {"pagesift_witness_up", "pagesift_witness_lease_remaining_seconds"}
WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


# ---------------------------------------------------------------- reading the kit


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    """(file name, document) for every object in deploy/k8s/*.yaml."""
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path.name, doc))
    return out


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"deploy/k8s: expected one {kind} {name}, found {len(found)}"
    return found[0]


def pagesift_container() -> dict[str, Any]:
    pod = k8s_object("StatefulSet", "pagesift")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "pagesift"]
    return dict(container)


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return doc


def compose_nodes() -> dict[str, dict[str, Any]]:
    """The compose services that run ``pagesift serve`` (the image's entrypoint)."""
    return {
        name: svc
        for name, svc in compose()["services"].items()
        if svc.get("image", "").startswith("pagesift") and "entrypoint" not in svc
    }


ETCD_IMAGES = ("gcr.io/etcd-development/etcd:v3.5.", "quay.io/coreos/etcd:v3.5.")
ETCD_AUTH = ["python", "-m", "pagesift.coord.etcdauth"]  # the etcd-auth service's entrypoint


def compose_etcd_members() -> dict[str, dict[str, Any]]:
    """The compose services that run an etcd member."""
    return {
        name: svc
        for name, svc in compose()["services"].items()
        if str(svc.get("image", "")).startswith(ETCD_IMAGES)
    }


def etcd_flags(svc: dict[str, Any]) -> dict[str, str]:
    """An etcd member's ``--flag=value`` command line as a dict (each flag once)."""
    command = [str(a) for a in svc["command"]]
    assert command[0] == "/usr/local/bin/etcd", command
    flags = dict(a.split("=", 1) for a in command[1:])
    assert len(flags) == len(command) - 1, f"a repeated or bare flag in {command}"
    return flags


def mounted_secrets(svc: dict[str, Any]) -> dict[str, str]:
    """path in the container -> compose secret, as compose mounts them: the short form
    and a relative ``target`` under /run/secrets/, an absolute ``target`` as it is."""
    out = {}
    for entry in svc.get("secrets", []):
        if isinstance(entry, str):
            entry = {"source": entry}
        target = str(entry.get("target", entry["source"]))
        path = target if target.startswith("/") else f"/run/secrets/{target}"
        out[path] = str(entry["source"])
    return out


def etcd_auth_args() -> Any:
    """The compose etcd-auth command through the real ``etcdauth`` parser."""
    svc = compose()["services"]["etcd-auth"]
    assert svc["entrypoint"] == ETCD_AUTH
    argv = [str(a) for a in svc["command"]]
    try:
        return etcdauth.parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"compose etcd-auth: `python -m pagesift.coord.etcdauth` rejects {argv}")


def auth_pairs(args: Any) -> list[str]:
    """The pairs the command makes users for, split as ``etcdauth.main`` splits them."""
    return [p.strip() for p in str(args.pairs).split(",") if p.strip()]


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def dockerfile(text: str | None = None) -> list[Instruction]:
    """deploy/Dockerfile's instructions (or those of ``text``), continuations joined."""
    if text is None:
        text = (DEPLOY / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            out.append(Instruction(keyword.upper(), args.strip()))
    return out


def docker_json(keyword: str) -> list[str]:
    """The exec-form (JSON) arguments of the last ``keyword`` instruction."""
    (last,) = [i for i in dockerfile() if i.keyword == keyword][-1:]
    args = last.args
    if keyword == "HEALTHCHECK":
        args = args[args.index("CMD") + len("CMD") :].strip()
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), last
    return value


def unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit's sections as (key, value) lists, in order (keys may repeat)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    text = re.sub(r"\\\n", " ", path.read_text())
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None and "=" in line, f"{path.name}: stray line {raw!r}"
        key, _, value = line.partition("=")
        current.append((key.strip(), value.strip()))
    return sections


def unit_value(sections: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    values = [v for k, v in sections.get(section, []) if k == key]
    assert values, f"no {key}= in [{section}]"
    return values[-1]


def env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def unit_serve_argv(path: Path) -> list[str]:
    """A unit's ``ExecStart`` after ``serve``, ``${VAR}`` taken from deploy/systemd/*.env."""
    sections = unit(path)
    command = unit_value(sections, "Service", "ExecStart").lstrip("-@:+!")
    env: dict[str, str] = {}
    for _, value in [kv for kv in sections["Service"] if kv[0] == "EnvironmentFile"]:
        example = SYSTEMD / Path(value.lstrip("-")).name
        assert example.exists(), f"{path.name}: {value} has no example {example.name} in deploy/"
        env.update(env_file(example))

    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in env, f"{path.name}: ${{{name}}} is set by no EnvironmentFile example"
        return env[name]

    argv = shlex.split(re.sub(r"\$\{(\w+)\}", expand, command))
    assert argv[0] == "/opt/pagesift/.venv/bin/pagesift" and argv[1] == "serve", argv
    return argv[2:]


# ---------------------------------------------------------------- every node of the kit


@dataclass(frozen=True)
class NodeSpec:
    where: str
    argv: list[str]  # the `pagesift serve` arguments
    config_text: str | None  # the TOML that its --config names, as deployed


def _configmap_for(container: dict[str, Any], config_path: str) -> str:
    """The text a container sees at ``config_path`` (a ConfigMap key mounted there)."""
    pod = k8s_object("StatefulSet", "pagesift")["spec"]["template"]["spec"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == config_path]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    cm = k8s_object("ConfigMap", volume["configMap"]["name"])
    text: str = cm["data"][mount["subPath"]]
    return text


def _config_arg(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config":
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def node_specs() -> list[NodeSpec]:
    """Every `pagesift serve` the kit runs, with the config it reads."""
    example = (DEPLOY / "pagesift.toml").read_text()

    def host_config(argv: list[str]) -> str | None:
        path = _config_arg(argv)
        assert path in (None, HOST_CONFIG), f"--config {path}: the kit mounts {HOST_CONFIG}"
        return example if path else None

    specs = []
    assert docker_json("ENTRYPOINT") == ["pagesift", "serve"]
    cmd = docker_json("CMD")
    specs.append(NodeSpec("Dockerfile CMD (deploy/pagesift.toml mounted)", cmd, host_config(cmd)))
    for name, svc in compose_nodes().items():
        argv = [str(a) for a in svc["command"]]
        specs.append(NodeSpec(f"compose.yaml: {name}", argv, host_config(argv)))
    container = pagesift_container()
    argv = [str(a) for a in container["args"]]
    path = _config_arg(argv)
    assert path is not None, "the StatefulSet's args give no --config"
    specs.append(NodeSpec("k8s StatefulSet pagesift", argv, _configmap_for(container, path)))
    for path_ in sorted(SYSTEMD.glob("*.service")):
        argv = unit_serve_argv(path_)
        text = host_config(argv)
        if "manual" in path_.name and text is not None:  # the file as its comment says:
            text = without_witness(text)  # no witness line (its ExecStartPre checks)
        specs.append(NodeSpec(f"systemd {path_.name}", argv, text))
    return specs


def without_witness(toml_text: str) -> str:
    return re.sub(r"(?m)^witness *=.*$", "", toml_text)


def serve_parser() -> Any:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    choices: Any = sub.choices  # the subparsers action's {name: parser}
    return choices["serve"]


def parse_serve(argv: list[str], where: str) -> Any:
    """``argv`` through the real ``pagesift serve`` parser; a bad flag fails the test."""
    try:
        args, unknown = serve_parser().parse_known_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `pagesift serve` rejects {argv}")
    if unknown:
        pytest.fail(f"{where}: `pagesift serve` has no flag(s) {unknown}")
    return args


def effective_config(spec: NodeSpec, tmp: Path) -> ServerConfig:
    """What ``pagesift serve`` would run with: defaults, the TOML, then the flags."""
    config_file = None
    if spec.config_text is not None:
        config_file = tmp / "config.toml"
        config_file.write_text(spec.config_text)
    overrides = serve_overrides(parse_serve(spec.argv, spec.where))
    try:
        return load_config(config_file, overrides)
    except (ValueError, TypeError) as err:
        pytest.fail(f"{spec.where}: the config does not load: {err}")


def accounts_placeholders(toml_text: str) -> list[str]:
    """The ``"REPLACE..."`` values of an accounts file (strings and list items)."""
    return re.findall(r'=\s*\[?"(REPLACE[^"]*)"', toml_text)


def host_of(address: str) -> str:
    return address.rsplit(":", 1)[0]


# ---------------------------------------------------------------- metric names


PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "inf", "nan",
}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression (not functions, labels or keywords)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = match.group(0)
        if s[match.end() :].lstrip().startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function or an aggregation, or a keyword
        names.add(word)
    return names


def exported_metric_names(tmp: Path) -> set[str]:
    """Every series name a node exports: a real Metrics() with every source set."""
    store = Store(tmp / "store")
    try:
        m = Metrics(
            ScrapeSources(
                jobs_store=lambda: store,
                webhook_queue_depth=lambda: 0,
                witness=lambda: WitnessGauges(up=True, lease_remaining=5.0, takeover_behind=0),
                storage=lambda: StorageFigures(
                    free_bytes=1 << 30, volume_bytes=1 << 32, reserve_bytes=1 << 26,
                    refusing=False,
                ),
                replication=lambda: ReplicationFigures(
                    role="primary", epoch=1, applied_offset=0, primary_offset=0,
                    acked_offset=0, lag_seconds=0.0, connected=False, backlog_bytes=0,
                    full_resyncs=0, sync_degraded=0,
                ),
                host_delays=lambda: {"example.com": 1.5},
            )
        )  # fmt: skip
        text = m.exposition().decode()
    finally:
        store.close()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
        names.update(sample.name for sample in family.samples)
    return names


def gateway_metric_names() -> set[str]:
    """The series a cluster's gateway exports besides the nodes' (its registry view's)."""
    gm = GatewayMetrics()
    gm.watch_rejected(lambda: {"bad_signature": 1})
    return {
        s.name
        for family in text_string_to_metric_families(gm.exposition().decode())
        for s in family.samples
    }


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "pagesift-alerts.yaml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DEPLOY / "grafana" / "pagesift-dashboard.json").read_text())
    return doc


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


# ================================================================ Kubernetes


def test_every_kubernetes_manifest_validates_strictly_against_the_schemas() -> None:
    docs = k8s_docs()
    assert {d["kind"] for _, d in docs} >= {
        "Namespace", "ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget",
    }  # fmt: skip
    for name, doc in docs:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']} ({version}): {err}")
    # the validator bites: an unknown field is refused in strict mode
    broken = json.loads(json.dumps(k8s_object("StatefulSet", "pagesift")))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_no_secret_values_are_committed_in_the_kubernetes_manifests() -> None:
    assert not [d for _, d in k8s_docs() if d["kind"] == "Secret"]
    pod = k8s_object("StatefulSet", "pagesift")["spec"]["template"]["spec"]
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"pagesift-secrets", "pagesift-tls", "pagesift-etcd-users"}
    header = (K8S / "40-pagesift-statefulset.yaml").read_text()
    for name in secrets:  # each one has its `kubectl create secret` line
        assert f"create secret generic {name}" in header, name


def test_the_primary_service_selects_by_readiness_on_pagesift_primary_and_peers_see_every_pod() -> (
    None
):
    sts = k8s_object("StatefulSet", "pagesift")
    spec = sts["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] == 2 and spec["selector"]["matchLabels"].items() <= labels.items()
    assert spec["podManagementPolicy"] == "Parallel"  # a pod never waits for the other's readiness
    assert spec["updateStrategy"]["type"] == "OnDelete"  # a rolling update would wait forever
    assert [t["metadata"]["name"] for t in spec["volumeClaimTemplates"]] == ["data"]
    container = pagesift_container()
    probe = HEALTHCHECK
    assert container["readinessProbe"]["exec"]["command"] == ["python", probe, "pagesift.primary"]
    assert container["livenessProbe"]["exec"]["command"] == ["python", probe, ""]
    assert container["startupProbe"]["exec"]["command"] == ["python", probe, ""]

    primary = k8s_object("Service", "pagesift-primary")["spec"]
    peers = k8s_object("Service", "pagesift-peers")["spec"]
    for svc in (primary, peers):
        assert svc["selector"].items() <= labels.items(), "a Service selects none of the pods"
    assert primary["type"] == "ClusterIP"
    assert primary.get("publishNotReadyAddresses", False) is False
    assert peers["clusterIP"] == "None" and peers["publishNotReadyAddresses"] is True
    assert spec["serviceName"] == "pagesift-peers"
    # every node advertises its own name under the peers service
    advertise = [a for a in container["args"] if a.startswith("--advertise=")]
    assert advertise == ["--advertise=$(POD_NAME).pagesift-peers.$(POD_NAMESPACE).svc:50051"]

    pdb = k8s_object("PodDisruptionBudget", "pagesift")["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"]["matchLabels"].items() <= labels.items()
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"


def test_every_kubernetes_pod_runs_restricted_with_resources_and_the_images_uid() -> None:
    image_uid = next(i.args for i in dockerfile() if i.keyword == "USER").split(":")[0]
    sets = [d for _, d in k8s_docs() if d["kind"] == "StatefulSet"]
    assert {s["metadata"]["name"] for s in sets} == {"pagesift", "pagesift-etcd"}
    for sts in sets:
        name = sts["metadata"]["name"]
        pod = sts["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        pod_sc = pod["securityContext"]
        assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] > 0, name
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert sc.get("runAsNonRoot", True) is True, (name, c["name"])
            res = c["resources"]
            assert {"cpu", "memory"} <= res["requests"].keys(), (name, c["name"])
            assert "memory" in res["limits"], (name, c["name"])
            assert c.get("livenessProbe") and c.get("readinessProbe"), (name, c["name"])
    pagesift = k8s_object("StatefulSet", "pagesift")["spec"]["template"]["spec"]
    assert str(pagesift["securityContext"]["runAsUser"]) == image_uid


def test_the_kubernetes_nodes_find_their_files_config_and_witness_on_mounted_volumes(
    tmp_path: Path,
) -> None:
    (spec,) = [s for s in node_specs() if s.where.startswith("k8s")]
    cfg = effective_config(spec, tmp_path)
    container = pagesift_container()
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    files = {
        "data": str(cfg.data),
        "accounts_file": cfg.accounts_file,
        "replication_token_file": cfg.replication_token_file,
        "tls_cert": cfg.tls_cert,
        "tls_key": cfg.tls_key,
        "replication_ca": cfg.replication_ca,
    }
    env = {e["name"]: e.get("value") for e in container["env"]}
    files["PAGESIFT_HEALTH_CA"] = env["PAGESIFT_HEALTH_CA"] or ""
    for key, path in files.items():
        assert path, f"k8s: {key} is not set"
        assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts), (key, path)
    # the witness is this kit's etcd Service (or the user's: then 10-etcd.yaml goes)
    etcd = k8s_object("Service", "pagesift-etcd")
    ns = etcd["metadata"]["namespace"]
    assert cfg.witness == f"etcd://pagesift-etcd.{ns}.svc:2379"
    policy = k8s_object("NetworkPolicy", "pagesift-etcd")["spec"]
    (from_pagesift,) = [r for r in policy["ingress"] if {"port": 2379} in r.get("ports", [])]
    assert from_pagesift["ports"] == [{"port": 2379}]
    peer = from_pagesift["from"][0]
    labels = k8s_object("StatefulSet", "pagesift")["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= labels.items()


# ================================================================ Docker and compose


def test_the_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    hadolint = VENV_BIN / "hadolint"
    run = subprocess.run(
        [str(hadolint), str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    bad = tmp_path / "Dockerfile"  # and it bites
    bad.write_text((DEPLOY / "Dockerfile").read_text().replace("USER 10001:10001", "USER root"))
    run = subprocess.run([str(hadolint), str(bad)], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "DL3002" in run.stdout


def test_the_image_installs_the_project_as_a_non_root_user_with_a_tls_health_probe() -> None:
    steps = dockerfile()
    assert steps[0] == Instruction("FROM", "python:3.11-slim")
    user = [i.args for i in steps if i.keyword == "USER"]
    assert len(user) == 1 and user[0].split(":")[0].isdigit() and int(user[0].split(":")[0]) > 0
    # a node: the server extra at the tested versions (tests/test_install_replay.py runs it)
    assert any(
        i.keyword == "RUN" and "pip install --no-cache-dir '.[server]' -c constraints.txt" in i.args
        for i in steps
    )
    assert json.loads(next(i.args for i in steps if i.keyword == "VOLUME")) == ["/var/lib/pagesift"]
    assert docker_json("HEALTHCHECK") == ["python", HEALTHCHECK]
    copies = {i.args.split()[-1]: i.args.split()[0] for i in steps if i.keyword == "COPY"}
    assert copies[HEALTHCHECK] == "deploy/healthcheck.py"
    # The build context holds every file pip needs: the readme and each package's folder.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {d.split("/")[0] for d in project["tool"]["setuptools"]["package-dir"].values()}
    copied = {src for i in steps if i.keyword == "COPY" for src in i.args.split()[:-1]}
    assert needed <= copied, f"the Dockerfile does not copy {needed - copied}"
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for src in copied:
        assert f"!{src}" in ignore or f"!{src}/" in ignore, f"{src} is not in the build context"


def test_the_compose_pair_runs_with_the_witness_healthchecks_and_file_secrets() -> None:
    doc = compose()
    nodes = compose_nodes()
    assert set(nodes) == {"node-a", "node-b"}
    declared = doc["secrets"]
    for name, svc in nodes.items():
        argv = [str(a) for a in svc["command"]]
        args = parse_serve(argv, f"compose {name}")
        assert args.role is None, f"{name}: with a witness there is no --role"
        assert args.witness and args.pair and args.witness_ttl == 5
        assert args.advertise == f"{svc['hostname']}:50051" and svc["hostname"] == name
        assert svc["healthcheck"]["test"] == ["CMD", "python", HEALTHCHECK]
        assert svc["environment"]["PAGESIFT_HEALTH_CA"].startswith("/run/secrets/")
        # every /run/secrets/X a node reads is one of its secrets, each a declared file
        used = {
            m.group(1)
            for a in [*argv, *svc["environment"].values()]
            for m in re.finditer(r"/run/secrets/(\w+)", str(a))
        }
        assert used and used <= set(svc["secrets"]) <= set(declared), (name, used)
    for secret in declared.values():
        assert secret["file"].startswith("./secrets/"), secret
    assert (DEPLOY / "secrets" / ".gitignore").read_text().splitlines()[1:] == ["*", "!.gitignore"]


def test_the_compose_witness_is_three_etcd_members_of_one_initial_cluster() -> None:
    doc = compose()
    members = compose_etcd_members()
    assert set(members) == {"e1", "e2", "e3"}, f"compose etcd members: {sorted(members)}"
    flags = {name: etcd_flags(svc) for name, svc in members.items()}
    peers = {name: f"http://{name}:2380" for name in members}
    clusters = {f["--initial-cluster"] for f in flags.values()}
    assert len(clusters) == 1, f"the members disagree on --initial-cluster: {clusters}"
    (initial,) = clusters
    assert dict(m.split("=", 1) for m in initial.split(",")) == peers  # each member, once
    assert len({f["--initial-cluster-token"] for f in flags.values()}) == 1
    volumes = set()
    for name, svc in members.items():
        f = flags[name]
        assert f["--name"] == name and svc.get("hostname", name) == name, name
        assert f["--initial-advertise-peer-urls"] == peers[name], name
        assert f["--advertise-client-urls"] == f"http://{name}:2379", name
        assert f["--listen-client-urls"].endswith(":2379"), name
        assert f["--listen-peer-urls"].endswith(":2380"), name
        assert f["--initial-cluster-state"] == "new", name
        assert svc["image"] == members["e1"]["image"], name  # one etcd version
        assert "ports" not in svc, f"{name}: etcd is published off the compose network"
        # healthy: this member answers a quorum read (etcdctl counts auth's refusal as one)
        test = svc["healthcheck"]["test"]
        assert test[:2] == ["CMD", "/usr/local/bin/etcdctl"] and test[-2:] == [
            "endpoint",
            "health",
        ], name
        (volume,) = svc["volumes"]
        source, mount = volume.split(":", 1)
        assert source in doc["volumes"] and f["--data-dir"].startswith(mount + "/"), name
        volumes.add(source)
    assert len(volumes) == 3, "each member keeps its own volume"
    assert "etcd" not in doc["services"] and "etcd-data" not in doc["volumes"]


def test_the_compose_etcd_auth_runs_the_real_command_after_the_members_and_before_the_nodes() -> (
    None
):
    doc = compose()
    services = doc["services"]
    svc = services["etcd-auth"]
    args = etcd_auth_args()  # the real parser accepts the command
    with pytest.raises(SystemExit):  # and would refuse one without the pairs
        etcdauth.parser().parse_args(
            [a for a in map(str, svc["command"]) if not a.startswith("--pairs")]
        )
    nodes = compose_nodes()
    assert {n["image"] for n in nodes.values()} == {svc["image"]}  # the nodes' image and client
    assert svc.get("restart", "no") == "no", "a one-shot: restarting it would race `up`"
    members = compose_etcd_members()
    assert svc["depends_on"] == {m: {"condition": "service_healthy"} for m in members}
    for name, node in nodes.items():
        assert node["depends_on"]["etcd-auth"] == {"condition": "service_completed_successfully"}, (
            name
        )
    # every member, by the address it advertises
    advertised = sorted(parse_witness(etcd_flags(m)["--advertise-client-urls"].replace(
        "http://", "etcd://"))[0] for m in members.values())  # fmt: skip
    assert sorted(parse_witness(args.etcd)) == advertised
    # its password directory holds exactly one file per user, each a declared file secret
    users = etcdauth.kit_users(args.cluster, auth_pairs(args))
    mounted = mounted_secrets(svc)
    folder = str(args.passwords).rstrip("/")
    wanted = {f"{folder}/{user}" for user in [etcdauth.ROOT, *users]}
    assert set(mounted) == wanted, f"etcd-auth mounts {sorted(mounted)}, reads {sorted(wanted)}"
    for source in mounted.values():
        assert doc["secrets"][source]["file"].startswith("./secrets/"), source


def test_every_compose_node_logs_in_to_all_three_members_as_its_pairs_user_from_a_secret(
    tmp_path: Path,
) -> None:
    doc = compose()
    auth = etcd_auth_args()
    auth_mounts = mounted_secrets(doc["services"]["etcd-auth"])
    folder = str(auth.passwords).rstrip("/")
    password_of = {
        path.rsplit("/", 1)[1]: doc["secrets"][s]["file"] for path, s in auth_mounts.items()
    }
    members = compose_etcd_members()
    endpoints = sorted((name, 2379) for name in members)
    assert folder and etcdauth.ROOT in password_of
    for name, svc in compose_nodes().items():
        spec = NodeSpec(f"compose.yaml: {name}", [str(a) for a in svc["command"]], None)
        cfg = effective_config(spec, tmp_path)
        assert sorted(parse_witness(cfg.witness)) == endpoints, f"{name}: {cfg.witness}"
        assert cfg.cluster == auth.cluster and cfg.pair in auth_pairs(auth), name
        # its own pair's user (a pair alone: the user is named as the pair), whose
        # password is the same host file etcd-auth set it from, mounted as a secret
        assert cfg.witness_user == cfg.pair, name
        node_mounts = mounted_secrets(svc)
        assert cfg.witness_password_file in node_mounts, f"{name}: not a mounted secret"
        secret = node_mounts[cfg.witness_password_file]
        assert doc["secrets"][secret]["file"] == password_of[cfg.witness_user], name
        assert doc["secrets"][secret]["file"] != password_of[etcdauth.ROOT], name
        root_file = password_of[etcdauth.ROOT]
        assert all(doc["secrets"][s]["file"] != root_file for s in node_mounts.values()), (
            f"{name} mounts etcd's root password"
        )
        # no literal credential anywhere in its definition
        assert not [e for e in svc.get("environment", {}) if "PASSWORD" in e.upper()], name


LOCAL_ETCD = Path("/usr/bin/etcd")  # Debian's etcd-server (tests/conftest.py's etcd)


def _on_loopback(value: str, ports: dict[tuple[str, int], int], me: str) -> str:
    """``value`` with every compose ``HOST:PORT`` (``0.0.0.0`` = member ``me``) made the
    loopback port that stands in for it."""

    def local(match: re.Match[str]) -> str:
        host = me if match.group(1) == "0.0.0.0" else match.group(1)
        return f"127.0.0.1:{ports[(host, int(match.group(2)))]}"

    return re.sub(r"(?<![\w.-])([\w.-]+):(\d+)\b", local, value)


def _http_get(url: str) -> bytes:
    with urlopen(url, timeout=2) as reply:
        body: bytes = reply.read()
        return body


async def _until_healthy(urls: list[str], timeout: float = 60.0) -> None:
    """Every etcd member's /health says true (a leader elected), within ``timeout``."""
    deadline = time.monotonic() + timeout
    waiting = list(urls)
    while waiting:
        url = waiting[0]
        try:
            body = await asyncio.to_thread(_http_get, url)
            if json.loads(body).get("health") == "true":
                waiting.pop(0)
                continue
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline, f"etcd never healthy at {waiting}"
        await asyncio.sleep(0.2)


@pytest.mark.system
@pytest.mark.skipif(not LOCAL_ETCD.exists(), reason="needs etcd at /usr/bin/etcd")
async def test_the_compose_etcd_members_form_one_cluster_that_etcd_auth_locks_to_the_pair(
    tmp_path: Path,
) -> None:
    """compose's three members, started with their own flags (hosts and ports made
    loopback, data under their volume's stand-in), form one cluster; compose's etcd-auth
    command (twice: it is run again after a change) turns auth on; a compose node's user,
    with the password compose mounts for it, takes the pair's lease through the
    endpoints it lists, the other node's user finds it held on every member, and
    without credentials nothing is allowed."""
    doc = compose()
    members = compose_etcd_members()
    ports = {(name, port): free_port() for name in members for port in (2379, 2380)}
    children: list[Child] = []
    witnesses: list[EtcdWitness] = []
    won: tuple[str, EtcdWitness, Lease] | None = None
    try:
        for name, svc in members.items():
            source, mount = svc["volumes"][0].split(":", 1)
            argv = [str(LOCAL_ETCD)]
            for flag, value in etcd_flags(svc).items():
                if flag == "--data-dir":
                    value = str(tmp_path / source) + value.removeprefix(mount)
                argv.append(f"{flag}={_on_loopback(value, ports, name)}")
            child = Child(name, argv, tmp_path / f"{name}.log")
            child.start()
            children.append(child)
        await _until_healthy([f"http://127.0.0.1:{ports[(m, 2379)]}/health" for m in members])

        # the host's secret files (fresh passwords), and the password folder compose
        # makes for etcd-auth out of them
        def host_file(secret: str) -> Path:
            return tmp_path / "deploy" / str(doc["secrets"][secret]["file"])

        for secret in doc["secrets"]:
            if secret.startswith("etcd"):
                host_file(secret).parent.mkdir(parents=True, exist_ok=True)
                host_file(secret).write_text(new_key() + "\n")
        auth_svc = doc["services"]["etcd-auth"]
        args = etcd_auth_args()
        folder = tmp_path / "etcd-auth-secrets"
        folder.mkdir()
        for path, secret in mounted_secrets(auth_svc).items():
            relative = Path(path).relative_to(str(args.passwords))
            (folder / relative).write_text(host_file(secret).read_text())
        argv = []
        for arg in map(str, auth_svc["command"]):
            if arg.startswith("--etcd="):
                arg = _on_loopback(arg, ports, "")
            elif arg.startswith("--passwords="):
                arg = f"--passwords={folder}"
            argv.append(arg)
        for _ in range(2):  # idempotent: the second run logs in as root
            run = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "pagesift.coord.etcdauth", *argv],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert run.returncode == 0 and "etcd auth: on" in run.stdout, run.stdout + run.stderr

        # each node as it logs in: the first takes the lease, the other finds it held
        for name, svc in compose_nodes().items():
            serve = parse_serve([str(a) for a in svc["command"]], name)
            url = _on_loopback(serve.witness, ports, "")
            assert len(parse_witness(url)) == 3, url
            pair = keys.witness_pair(serve.pair, serve.cluster or "")
            secret = mounted_secrets(svc)[serve.witness_password_file]
            password = host_file(secret).read_text().strip()  # as the node reads it
            me = Holder(name, f"{name}:50051", f"{name}:50051")
            anonymous = EtcdWitness(url, pair, timeout=10.0)
            witnesses.append(anonymous)
            with pytest.raises(EtcdUnavailable):  # auth is on
                await anonymous.campaign(me, 10)
            witness = EtcdWitness(
                url, pair, timeout=10.0, user=serve.witness_user, password=password
            )
            witnesses.append(witness)
            if won is None:
                lease = await witness.campaign(me, 10)
                assert lease is not None, f"{name}: its etcd user could not take the lease"
                won = (name, witness, lease)
            else:
                assert await witness.campaign(me, 10) is None, f"{name} took a held lease"
                for host, port in parse_witness(url):  # one cluster: each member knows
                    alone = EtcdWitness(
                        f"etcd://{host}:{port}",
                        pair,
                        timeout=10.0,
                        user=serve.witness_user,
                        password=password,
                    )
                    witnesses.append(alone)
                    held = await alone.holder()
                    assert held is not None and held.node_id == won[0], (port, held)
        assert won is not None
    finally:
        if won is not None:
            await won[1].resign(won[2])
        for w in witnesses:
            await w.close()
        for child in children:
            child.stop(10.0)


def test_the_certificate_recipes_name_every_address_a_peer_or_the_probe_dials() -> None:
    def recipe_names(path: Path) -> list[str]:
        text = re.sub(r"\\\n#\s*", " ", path.read_text())
        (line,) = [ln for ln in text.splitlines() if "make-certs.sh" in ln and "sh deploy" in ln]
        words = shlex.split(line.split("make-certs.sh", 1)[1].split("#")[0])
        return words[1:]  # after OUT_DIR

    compose_names = recipe_names(DEPLOY / "compose.yaml")
    for name, svc in compose_nodes().items():
        assert svc["hostname"] in compose_names, name
    k8s_names = recipe_names(K8S / "40-pagesift-statefulset.yaml")
    ns = k8s_object("Service", "pagesift-peers")["metadata"]["namespace"]
    for pod in ("pagesift-0", "pagesift-1"):
        host = f"{pod}.pagesift-peers.{ns}.svc"
        assert any(fnmatchcase(host, n) for n in k8s_names), host
    assert f"pagesift-primary.{ns}.svc" in k8s_names
    assert "localhost" in compose_names and "localhost" in k8s_names  # the health probe's name


# ================================================================ flags, keys, never open


def test_every_serve_flag_used_anywhere_in_the_kit_exists_in_the_real_parser() -> None:
    specs = node_specs()
    assert len(specs) == 1 + 2 + 1 + 3  # image, compose pair, StatefulSet, three units
    for spec in specs:
        parse_serve(spec.argv, spec.where)
    with pytest.raises(pytest.fail.Exception):  # and the check bites
        parse_serve(["--no-such-flag"], "a test")


def test_every_config_key_in_the_example_and_the_configmap_is_a_server_config_field() -> None:
    defaults = {f.name: f.default for f in fields(ServerConfig)}
    texts = {
        "deploy/pagesift.toml": (DEPLOY / "pagesift.toml").read_text(),
        "ConfigMap pagesift-config": k8s_object("ConfigMap", "pagesift-config")["data"][
            "pagesift.toml"
        ],
    }
    for where, text in texts.items():
        doc = tomllib.loads(text)
        assert set(doc) == {"server"}, where
        for key, value in doc["server"].items():
            assert key in defaults, f"{where}: {key} is not a ServerConfig field"
            want = type(defaults[key])
            ok = isinstance(value, want) or (want is float and type(value) is int)
            if want is not bool:
                ok = ok and not isinstance(value, bool)
            assert ok, f"{where}: {key} = {value!r} is not a {want.__name__}"
        for key in ("witness", "witness_ttl", "pair", "accounts_file", "replication_token_file"):
            assert key in doc["server"], f"{where}: no {key}"
    assert "advertise" in tomllib.loads(texts["deploy/pagesift.toml"])["server"]


def test_no_node_of_the_kit_starts_open(tmp_path: Path) -> None:
    """Every node has API keys and a replication credential, and one reachable off its
    host serves TLS (its standby then needs the CA to verify the primary)."""
    for spec in node_specs():
        cfg = effective_config(spec, tmp_path)
        where = spec.where
        assert cfg.accounts_file, f"{where}: no accounts_file (every caller is anonymous)"
        mtls = bool(cfg.replication_ca and cfg.replication_cert and cfg.replication_key)
        assert cfg.replication_token_file or mtls, f"{where}: no replication credential"
        host = host_of(cfg.listen)
        assert host not in WILDCARD_HOSTS or cfg.tls_cert, f"{where}: {cfg.listen} without TLS"
        if host not in LOOPBACK_HOSTS:
            assert cfg.tls_cert and cfg.tls_key, f"{where}: {cfg.listen} off loopback without TLS"
            # the standby verifies its primary's certificate with it, or cannot connect
            assert cfg.replication_ca, f"{where}: TLS without replication_ca"
        assert not cfg.unsafe_auto_promote and not cfg.allow_private_networks, where


def test_witness_nodes_never_name_a_role_and_manual_units_always_do(tmp_path: Path) -> None:
    for spec in node_specs():
        args = parse_serve(spec.argv, spec.where)
        cfg = effective_config(spec, tmp_path)
        if "manual" in spec.where:
            assert args.role in ("primary", "standby") and not cfg.witness, spec.where
            if args.role == "standby":
                assert args.primary, spec.where
        else:
            assert args.role is None, f"{spec.where}: with a witness the lease decides, no --role"
            assert parse_witness(cfg.witness) and cfg.pair, spec.where
            assert cfg.witness_ttl >= MIN_TTL, spec.where
            # peers must be told where to reach it (a wildcard listen says nothing)
            assert cfg.advertise and host_of(cfg.advertise) not in WILDCARD_HOSTS, spec.where


def test_the_accounts_example_is_refused_until_every_placeholder_is_replaced() -> None:
    path = DEPLOY / "accounts.example.toml"
    text = path.read_text()
    placeholders = accounts_placeholders(text)
    assert len(placeholders) == 3  # the admin key's hash, acme's hash, acme's webhook secret
    real = {p: new_key() if p == "REPLACE-ME" else hash_key(new_key()) for p in placeholders}
    with pytest.raises(AccountsError):
        Accounts.from_dict(tomllib.loads(text))
    for left in placeholders:  # any one placeholder left is enough to refuse the file
        partial = text
        for p in placeholders:
            if p != left:
                partial = partial.replace(f'"{p}"', f'"{real[p]}"')
        with pytest.raises(AccountsError):
            Accounts.from_dict(tomllib.loads(partial))
    done = text
    for p in placeholders:
        done = done.replace(f'"{p}"', f'"{real[p]}"')
    accounts = Accounts.from_dict(tomllib.loads(done))
    assert accounts.has_admin_key and not accounts.anonymous and accounts.names == ["acme"]


# ================================================================ systemd


def test_the_systemd_units_parse_and_restart_only_where_it_is_safe() -> None:
    units = {p.name: unit(p) for p in SYSTEMD.glob("*.service")}
    assert set(units) == {
        "pagesift-witness.service",
        "pagesift-manual-primary.service",
        "pagesift-manual-standby.service",
    }
    primary = units["pagesift-manual-primary.service"]
    assert unit_value(primary, "Service", "Restart") == "no"
    assert "Install" not in primary, "the manual primary must not start at boot either"
    for name in ("pagesift-witness.service", "pagesift-manual-standby.service"):
        assert unit_value(units[name], "Service", "Restart") == "on-failure", name
        assert unit_value(units[name], "Install", "WantedBy") == "multi-user.target", name
    for name, sections in units.items():
        service = dict(sections["Service"])
        for key, want in {
            "NoNewPrivileges": "yes",
            "ProtectSystem": "strict",
            "PrivateTmp": "yes",
            "StateDirectory": "pagesift",
            "User": "pagesift",
            "CapabilityBoundingSet": "",
        }.items():
            assert service.get(key) == want, f"{name}: {key}={service.get(key)!r}"
        others = set(units) - {name}
        assert set(unit_value(sections, "Unit", "Conflicts").split()) == others, name
    # the witness unit's RestartSec lets a crashed primary's lease lapse first
    ttl = tomllib.loads((DEPLOY / "pagesift.toml").read_text())["server"]["witness_ttl"]
    restart_sec = unit_value(units["pagesift-witness.service"], "Service", "RestartSec")
    assert float(restart_sec.removesuffix("s")) > 2 * ttl


def test_each_systemd_mode_refuses_a_config_file_of_the_other_mode(tmp_path: Path) -> None:
    """The witness unit's ExecStartPre refuses a file without a witness (with no --role
    the node would start, and be restarted, as a primary); pagesift itself refuses the
    manual units' --role when the file names a witness (the lease decides)."""
    with_witness = (DEPLOY / "pagesift.toml").read_text()
    sections = unit(SYSTEMD / "pagesift-witness.service")
    (pre,) = [v for k, v in sections["Service"] if k == "ExecStartPre"]
    config = tmp_path / "pagesift.toml"
    results = {}
    for label, text in (("with", with_witness), ("without", without_witness(with_witness))):
        config.write_text(text)
        argv = shlex.split(pre.replace(HOST_CONFIG, str(config)))
        results[label] = subprocess.run(argv, capture_output=True, timeout=10).returncode
    assert results == {"with": 0, "without": 1}, results

    config.write_text(with_witness)
    for name in ("pagesift-manual-primary.service", "pagesift-manual-standby.service"):
        argv = unit_serve_argv(SYSTEMD / name)
        argv[argv.index("--config") + 1] = str(config)
        argv[argv.index("--data") + 1] = str(tmp_path / "data")
        run = subprocess.run(
            [str(VENV_BIN / "pagesift"), "serve", *argv], capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 2 and "drop --role" in run.stderr, (name, run.stderr)
    assert not (tmp_path / "data").exists()  # refused before anything started


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # ExecStart must name an executable that exists: this checkout's venv stands in for
    # /opt/pagesift/.venv.
    for path in SYSTEMD.glob("*.service"):
        text = path.read_text().replace("/opt/pagesift/.venv/bin", str(VENV_BIN))
        (tmp_path / path.name).write_text(text)
    bad = (SYSTEMD / "pagesift-witness.service").read_text().replace("Restart=on", "Restart=onn")
    (tmp_path / "broken.service").write_text(bad)
    for name in [p.name for p in SYSTEMD.glob("*.service")] + ["broken.service"]:
        run = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", f"./{name}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        output = (run.stdout + run.stderr).strip()
        if name == "broken.service":  # the check bites
            assert "restart" in output.lower(), output
        else:
            assert run.returncode == 0 and not output, f"{name}: {output}"


# ================================================================ Prometheus and Grafana


def test_the_metric_name_reader_finds_names_not_functions_labels_or_keywords() -> None:
    expr = (
        'sum by (pair) (rate(a_total{role="primary", x=~"b|c"}[5m])) > 1e3 and on (job) '
        "b_gauge offset 5m or histogram_quantile(0.9, c_bucket) == bool inf"
    )
    assert promql_metric_names(expr) == {"a_total", "b_gauge", "c_bucket"}


def test_alert_rules_cover_each_failure_and_use_only_exported_metrics(tmp_path: Path) -> None:
    known = exported_metric_names(tmp_path) | gateway_metric_names()
    assert {"pagesift_replication_role", "pagesift_pages_total", "pagesift_jobs"} <= known
    assert known >= WITNESS_METRICS, "the witness series the alerts use are not exported"
    rules = alert_rules()
    for rule in rules:
        unknown = promql_metric_names(rule["expr"]) - known
        assert not unknown, f"{rule['alert']}: {sorted(unknown)} is exported by no node"
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    by_metric = {
        "replication lag": ("pagesift_replication_lag_seconds", ">"),
        "standby disconnected": ("pagesift_replication_connected", "== 0"),
        "no primary": ('pagesift_replication_role{role="primary"}', "< 1"),
        "two primaries": ('pagesift_replication_role{role="primary"}', "> 1"),
        "sync degraded": ("pagesift_replication_sync_degraded_total", "increase"),
        "fenced node": ('pagesift_replication_role{role="fenced"}', "== 1"),
        "witness unreachable": ("pagesift_witness_up", "== 0"),
        "store refusing writes": ("pagesift_store_refusing_writes", "== 1"),
        "data volume nearly full": ("pagesift_store_free_bytes", "<"),
    }
    for failure, (series, test) in by_metric.items():
        assert any(series in r["expr"] and test in r["expr"] for r in rules), failure


@pytest.mark.system
def test_promtool_accepts_the_alert_rules_and_their_unit_tests_pass() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required: apt-get install -y --no-install-recommends prometheus"
    folder = DEPLOY / "prometheus"
    for argv in (
        [promtool, "check", "rules", "pagesift-alerts.yaml"],
        [promtool, "test", "rules", "pagesift-alerts.test.yaml"],
    ):
        run = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr


def test_the_dashboard_shows_role_lag_pages_jobs_webhooks_and_the_witness(tmp_path: Path) -> None:
    doc = dashboard()
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["uid"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    known = exported_metric_names(tmp_path)
    used: set[str] = set()
    for title, expr in dashboard_exprs():
        names = promql_metric_names(expr)
        assert names and not names - known, f"panel {title!r}: {sorted(names - known)}"
        used |= names
    for metric in (
        "pagesift_replication_role",
        "pagesift_replication_lag_seconds",
        "pagesift_pages_total",
        "pagesift_jobs",
        "pagesift_webhook_queue_depth",
        "pagesift_witness_up",
    ):
        assert metric in used, f"no panel shows {metric}"


# ================================================================ every file says what it is


def test_every_deploy_file_opens_with_a_comment_saying_what_it_is() -> None:
    for path in sorted(DEPLOY.rglob("*")):
        if not path.is_file() or path.suffix == ".json" or "secrets" in path.parts:
            continue
        lines = path.read_text().splitlines()
        first = lines[1] if lines[0].startswith("#!") else lines[0]
        if path.suffix == ".py":
            assert first.startswith('"""'), path
        else:
            assert first.startswith("# ") and len(first) > 20, path
    assert "nothing to replace" in dashboard()["description"].lower()


# ================================================================ end to end: the example config


def _toml(values: dict[str, Any]) -> str:
    return "[server]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


def _probe(address: str, service: str, ca: Path | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PAGESIFT_HEALTH_ADDR=address, PAGESIFT_HEALTH_CA=str(ca or ""))
    return subprocess.run(
        [sys.executable, str(DEPLOY / "healthcheck.py"), service],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _until_probe(address: str, service: str, ca: Path, timeout: float = 45.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        run = _probe(address, service, ca)
        if run.returncode == 0:
            return
        assert time.monotonic() < deadline, f"{address} {service!r} never SERVING: {run.stdout}"
        time.sleep(0.5)


@pytest.mark.system
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_a_pair_from_the_example_config_serves_tls_health_that_the_probe_script_reads(
    tmp_path: Path,
) -> None:
    """deploy/pagesift.toml (paths and addresses made local, no etcd: --role instead) with
    certificates from deploy/make-certs.sh: a standby follows its primary over TLS, and
    the image's probe tells the primary from the replica; plaintext gets no answer."""
    certs = tmp_path / "tls"
    run = subprocess.run(
        ["sh", str(DEPLOY / "make-certs.sh"), str(certs), "localhost", "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert (certs / "node.key").stat().st_mode & 0o077 == 0
    token = tmp_path / "replication.token"
    subprocess.run([str(VENV_BIN / "pagesift"), "token", "new", str(token)], check=True, timeout=30)
    accounts = (DEPLOY / "accounts.example.toml").read_text()
    for placeholder in accounts_placeholders(accounts):
        real = new_key() if placeholder == "REPLACE-ME" else hash_key(new_key())
        accounts = accounts.replace(f'"{placeholder}"', f'"{real}"')
    (tmp_path / "accounts.toml").write_text(accounts)

    example = tomllib.loads((DEPLOY / "pagesift.toml").read_text())["server"]
    procs: list[Child] = []
    addresses = {}
    for name in ("a", "b"):
        address = f"127.0.0.1:{free_port()}"
        addresses[name] = address
        settings = dict(example)
        del settings["witness"]  # no etcd on this machine: the manual mode's --role instead
        settings.update(
            listen=address,
            advertise=address,
            metrics_listen=f"127.0.0.1:{free_port()}",
            accounts_file=str(tmp_path / "accounts.toml"),
            replication_token_file=str(token),
            tls_cert=str(certs / "node.pem"),
            tls_key=str(certs / "node.key"),
            replication_ca=str(certs / "ca.pem"),
            extract_processes=1,
        )
        config = tmp_path / f"{name}.toml"
        config.write_text(_toml(settings))
        role = ["--role", "primary"] if name == "a" else ["--role", "standby", "--primary"]
        argv = [*role, *([addresses["a"]] if name == "b" else [])]
        argv += ["--config", str(config), "--data", str(tmp_path / name)]
        procs.append(start_server_process(argv, tmp_path / f"{name}.log"))
    try:
        ca = certs / "ca.pem"
        _until_probe(addresses["a"], "pagesift.primary", ca)
        _until_probe(addresses["b"], "pagesift.replica", ca)  # it followed over TLS
        assert _probe(addresses["b"], "pagesift.primary", ca).returncode == 1
        assert _probe(addresses["a"], "pagesift.replica", ca).returncode == 1
        assert _probe(addresses["a"], "pagesift.replica,pagesift.primary", ca).returncode == 0
        assert _probe(addresses["a"], "", None).returncode == 1  # plaintext: no answer
        # the image's own HEALTHCHECK command, run the way Docker runs it
        docker = docker_json("HEALTHCHECK")
        assert docker[1] == HEALTHCHECK
        env = dict(os.environ, PAGESIFT_HEALTH_ADDR=addresses["b"], PAGESIFT_HEALTH_CA=str(ca))
        run = subprocess.run(
            [sys.executable, str(DEPLOY / "healthcheck.py"), *docker[2:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert run.returncode == 0 and "SERVING" in run.stdout, run.stdout
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.stop(10.0, term_group=False)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
