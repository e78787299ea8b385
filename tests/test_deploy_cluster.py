"""The cluster kit (``deploy/k8s-cluster``): N pairs and the gateway, checked like the kit.

``kubectl kustomize deploy/k8s-cluster`` renders it offline (no cluster needed), from the
single-pair kit of ``deploy/k8s`` (a kustomize base through ``deploy/k8s/Kustomization``):
the namespace and etcd once, each pair an overlay (``pairs/NAME``), the gateway. Every
rendered object goes through the Kubernetes schemas (kubernetes-validate, strict, the
oldest and newest version the kit targets); every node's arguments are expanded as the
kubelet expands them (``$(VAR)`` from the container's env and the downward API) and go
through the real ``pagesift serve`` parser and config loader; every selector (Services,
PodDisruptionBudgets, workload selectors, anti-affinity, the etcd NetworkPolicy) is
matched against every pod template's labels, so a Service of pair a that selected a pod
of pair b fails. The gateway's flags go through the real ``pagesift gateway`` parser.

kubectl 1.27 or later is required (``kubectl kustomize``, kustomize v5, renders the kit).
"""

from __future__ import annotations

import base64
import functools
import json
import re
import shlex
import shutil
import subprocess
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pagesift.cli import build_parser
from pagesift.coord import etcdauth
from pagesift.core.cluster.ids import check_pair_name
from pagesift.core.cluster.members import parse_members
from pagesift.core.cluster.registryrules import parse_cluster_url
from pagesift.core.ha.election import MIN_TTL, parse_witness
from tests.test_deploy_kit import (
    HEALTHCHECK,
    K8S_VERSIONS,
    LOOPBACK_HOSTS,
    WILDCARD_HOSTS,
    NodeSpec,
    dockerfile,
    effective_config,
    host_of,
    parse_serve,
)

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KIT = DEPLOY / "k8s"
CLUSTER = DEPLOY / "k8s-cluster"
PAIRS = ("a", "b", "c")  # the example pairs
PAIR_LABEL = "pagesift.dev/pair"
CONFIG_PATH = "/etc/pagesift/pagesift.toml"
Doc = dict[str, Any]


# ---------------------------------------------------------------- rendering


@functools.cache
def kubectl() -> str:
    """kubectl, checked to embed kustomize v5 or later (kubectl 1.27+)."""
    found = shutil.which("kubectl")
    assert found, (
        "kubectl 1.27+ is required: `kubectl kustomize` renders the cluster kit (no cluster "
        "needed); https://kubernetes.io/docs/tasks/tools/ (Debian's kubernetes-client is too old)"
    )
    run = subprocess.run(
        [found, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60
    )
    version = json.loads(run.stdout).get("kustomizeVersion", "")
    major = re.match(r"v(\d+)\.", version)
    assert major and int(major.group(1)) >= 5, f"kubectl embeds kustomize {version!r}: need v5+"
    return found


def kustomize(folder: Path) -> list[Doc]:
    run = subprocess.run(
        [kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"kubectl kustomize {folder}: {run.stderr}"
    return [d for d in yaml.safe_load_all(run.stdout) if d is not None]


@functools.cache
def _rendered() -> str:
    return json.dumps(kustomize(CLUSTER))


def rendered() -> list[Doc]:
    """The cluster kit's objects (a fresh copy each call: tests may edit it)."""
    docs: list[Doc] = json.loads(_rendered())
    return docs


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pair_sets(docs: list[Doc]) -> dict[str, Doc]:
    """pair name -> its StatefulSet (the pagesift StatefulSets, by their pair label)."""
    out = {}
    for sts in of_kind(docs, "StatefulSet"):
        labels = sts["spec"]["template"]["metadata"]["labels"]
        if labels.get("app.kubernetes.io/name") == "pagesift":
            pair = labels[PAIR_LABEL]
            assert pair not in out, f"two StatefulSets for pair {pair}"
            out[pair] = sts
    return out


def container(workload: Doc, name: str) -> Doc:
    (found,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return dict(found)


def gateway() -> Doc:
    return one(rendered(), "Deployment", "pagesift-gateway")


# ---------------------------------------------------------------- as the kubelet sees it


def pod_env(workload: Doc, c: Doc, pod_name: str) -> dict[str, str]:
    """The container's environment in pod ``pod_name`` (literal values and the downward
    API's name, namespace and labels)."""
    meta = {
        "metadata.name": pod_name,
        "metadata.namespace": workload["metadata"]["namespace"],
    }
    labels = workload["spec"]["template"]["metadata"]["labels"]
    env: dict[str, str] = {}
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
            continue
        path = var["valueFrom"]["fieldRef"]["fieldPath"]
        label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
        if label:
            assert label.group(1) in labels, f"{pod_name}: env {var['name']}: no label {path}"
            env[var["name"]] = labels[label.group(1)]
        else:
            env[var["name"]] = meta[path]
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, ``$$`` is ``$``,
    an undefined reference stays as it is written."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)


def node_argv(sts: Doc, ordinal: int) -> list[str]:
    """``pagesift serve``'s arguments in pod ``ordinal`` of ``sts``, expanded."""
    c = container(sts, "pagesift")
    pod = f"{sts['metadata']['name']}-{ordinal}"
    env = pod_env(sts, c, pod)
    argv = [expand(a, env) for a in c["args"]]
    left = [a for a in argv if "$(" in a]
    assert not left, f"{pod}: unresolved references in {left}"
    return argv


def node_spec(docs: list[Doc], sts: Doc, ordinal: int) -> NodeSpec:
    """The node's arguments and the config text its --config names (a ConfigMap key)."""
    argv = node_argv(sts, ordinal)
    assert f"--config={CONFIG_PATH}" in argv, sts["metadata"]["name"]
    c = container(sts, "pagesift")
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == CONFIG_PATH]
    pod = sts["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    cm = one(docs, "ConfigMap", volume["configMap"]["name"])
    where = f"k8s-cluster {sts['metadata']['name']}-{ordinal}"
    return NodeSpec(where, argv, cm["data"][mount["subPath"]])


def gateway_parser() -> Any:
    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    choices: Any = sub.choices
    return choices["gateway"]


# ---------------------------------------------------------------- selectors


def selects(selector: Doc, labels: dict[str, str]) -> bool:
    """Whether a Service selector (a plain map) or a LabelSelector (matchLabels,
    matchExpressions) selects a pod with ``labels``."""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        return True  # an empty LabelSelector selects everything
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def pod_templates(docs: list[Doc]) -> dict[str, dict[str, str]]:
    """'Kind/name' of each workload -> its pods' labels."""
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "ReplicaSet", "Job")
    }


def selected(selector: Doc, docs: list[Doc]) -> set[str]:
    return {w for w, labels in pod_templates(docs).items() if selects(selector, labels)}


def selectors(docs: list[Doc]) -> list[tuple[str, Doc, str | None]]:
    """(what, selector, the one workload it must select; None: a shared object) for every
    Service, PodDisruptionBudget, workload selector and anti-affinity term."""
    by_pair = {p: f"StatefulSet/{s['metadata']['name']}" for p, s in pair_sets(docs).items()}
    out: list[tuple[str, Doc, str | None]] = []
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        pair = d["metadata"].get("labels", {}).get(PAIR_LABEL)
        owner = by_pair[pair] if pair else None
        if kind == "Service":
            out.append((f"Service {name}", d["spec"]["selector"], owner))
        elif kind == "PodDisruptionBudget":
            out.append((f"PodDisruptionBudget {name}", d["spec"]["selector"], owner))
        elif kind in ("StatefulSet", "Deployment"):
            me = f"{kind}/{name}"
            out.append((f"{me} selector", d["spec"]["selector"], me))
            anti = d["spec"]["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {})
            terms = list(anti.get("requiredDuringSchedulingIgnoredDuringExecution", []))
            terms += [
                t["podAffinityTerm"]
                for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])
            ]
            for term in terms:
                out.append((f"{me} anti-affinity", term["labelSelector"], me))
    return out


# ================================================================ the base and the rendering


def test_the_single_pair_kit_is_a_kustomize_base_listing_every_manifest_unchanged() -> None:
    base = yaml.safe_load((KIT / "Kustomization").read_text())
    assert base["resources"] == sorted(p.name for p in KIT.glob("*.yaml")), (
        "deploy/k8s/Kustomization must list every manifest of the kit (the cluster kit is "
        "built from it)"
    )
    files = [d for p in sorted(KIT.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]

    def key(d: Doc) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    # `kubectl apply -k deploy/k8s` applies exactly what `kubectl apply -f deploy/k8s/` does
    assert sorted(kustomize(KIT), key=key) == sorted(files, key=key)


def test_every_object_of_the_cluster_kit_validates_strictly_against_the_schemas() -> None:
    docs = rendered()
    assert {d["kind"] for d in docs} >= {
        "Namespace", "ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget",
        "NetworkPolicy", "Deployment",
    }  # fmt: skip
    for doc in docs:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(f"{doc['kind']} {doc['metadata']['name']} ({version}): {err}")
    broken = gateway()  # the validator bites on the gateway too
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_the_namespace_and_etcd_appear_once_and_each_pair_has_its_own_objects() -> None:
    docs = rendered()
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), "two objects with one kind, namespace and name"
    assert [d["metadata"]["name"] for d in of_kind(docs, "Namespace")] == ["pagesift"]
    ns = one(docs, "Namespace", "pagesift")["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] != "Namespace"} == {"pagesift"}
    etcd = [d for d in docs if "etcd" in d["metadata"]["name"]]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in etcd) == [
        ("Job", "pagesift-etcd-auth"),
        ("NetworkPolicy", "pagesift-etcd"),
        ("PodDisruptionBudget", "pagesift-etcd"),
        ("Service", "pagesift-etcd"),
        ("StatefulSet", "pagesift-etcd"),
    ]
    sets = pair_sets(docs)
    assert sorted(sets) == list(PAIRS)
    for pair, sts in sets.items():
        owned = sorted(
            (d["kind"], d["metadata"]["name"])
            for d in docs
            if d["metadata"].get("labels", {}).get(PAIR_LABEL) == pair
        )
        assert owned == sorted(
            [
                ("ConfigMap", f"pagesift-config-{pair}"),
                ("PodDisruptionBudget", f"pagesift-{pair}"),
                ("Service", f"pagesift-peers-{pair}"),
                ("Service", f"pagesift-primary-{pair}"),
                ("StatefulSet", f"pagesift-{pair}"),
            ]
        ), pair
        assert (
            sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == f"pagesift-peers-{pair}"
        )
        assert sts["spec"]["updateStrategy"]["type"] == "OnDelete"
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        peers = one(docs, "Service", f"pagesift-peers-{pair}")["spec"]
        primary = one(docs, "Service", f"pagesift-primary-{pair}")["spec"]
        assert peers["clusterIP"] == "None" and peers["publishNotReadyAddresses"] is True
        assert primary["type"] == "ClusterIP" and not primary.get("publishNotReadyAddresses")
        pdb = one(docs, "PodDisruptionBudget", f"pagesift-{pair}")["spec"]
        assert pdb["maxUnavailable"] == 1


def test_the_pair_overlays_differ_by_their_name_only_and_all_are_listed() -> None:
    """Adding a pair is copying pairs/a and replacing its name: the overlays differ by
    the name only, and the top kustomization lists every one of them."""
    overlays = sorted(p.name for p in (CLUSTER / "pairs").iterdir() if p.is_dir())
    assert overlays == list(PAIRS)
    texts = {p: (CLUSTER / "pairs" / p / "kustomization.yaml").read_text() for p in PAIRS}
    for pair, text in texts.items():
        assert text.startswith(f'# Pair "{pair}" of the cluster'), pair
        doc = yaml.safe_load(text)
        patches = doc.pop("patches")
        assert doc == {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["../../pair"],
            "nameSuffix": f"-{pair}",
            "labels": [
                {
                    "pairs": {"app.kubernetes.io/instance": f"pagesift-{pair}", PAIR_LABEL: pair},
                    "includeSelectors": True,
                }
            ],
        }, pair
        # its own items of the shared Secrets: the same patch, named for the pair
        first = texts[PAIRS[0]].split("patches:", 1)[1]
        named = {f"key: {PAIRS[0]},": f"key: {pair},", f"key: {PAIRS[0]}.key": f"key: {pair}.key"}
        renamed = functools.reduce(lambda t, kv: t.replace(*kv), named.items(), first)
        assert text.split("patches:", 1)[1] == renamed, pair
        assert len(patches) == 1, pair
        check_pair_name(pair)
    top = yaml.safe_load((CLUSTER / "kustomization.yaml").read_text())
    assert top["resources"] == ["shared", *(f"pairs/{p}" for p in PAIRS), "gateway"]
    for path in CLUSTER.rglob("kustomization.yaml"):  # no Secret is generated from a file
        doc = yaml.safe_load(path.read_text())
        assert "secretGenerator" not in doc and "configMapGenerator" not in doc, path


# ================================================================ the nodes


def test_every_pairs_nodes_run_serve_with_a_distinct_pair_one_cluster_and_one_witness(
    tmp_path: Path,
) -> None:
    docs = rendered()
    witness = {}
    clusters = {}
    for pair, sts in pair_sets(docs).items():
        for ordinal in range(sts["spec"]["replicas"]):
            spec = node_spec(docs, sts, ordinal)
            args = parse_serve(spec.argv, spec.where)  # the real parser: a bad flag fails
            cfg = effective_config(spec, tmp_path)  # the real loader: a bad key fails
            assert args.role is None and args.primary is None, f"{spec.where}: the lease decides"
            assert args.pair == pair and cfg.pair == pair, spec.where
            assert args.cluster and cfg.cluster == args.cluster, spec.where
            check_pair_name(cfg.pair)  # what `serve` checks before it starts
            check_pair_name(cfg.cluster)
            parse_witness(cfg.witness)
            assert cfg.witness_ttl >= MIN_TTL, spec.where
            witness[spec.where] = cfg.witness
            clusters[spec.where] = cfg.cluster
            # it advertises its own name under its own pair's headless Service
            pod = f"{sts['metadata']['name']}-{ordinal}"
            ns = sts["metadata"]["namespace"]
            assert cfg.advertise == f"{pod}.{sts['spec']['serviceName']}.{ns}.svc:50051"
            assert host_of(cfg.advertise) not in WILDCARD_HOSTS
            # and is never open (the kit's rules)
            assert cfg.accounts_file and cfg.replication_token_file, spec.where
            assert host_of(cfg.listen) in LOOPBACK_HOSTS or (cfg.tls_cert and cfg.tls_key)
            assert cfg.replication_ca, spec.where
            assert not cfg.unsafe_auto_promote and not cfg.allow_private_networks
    assert len(witness) == 2 * len(PAIRS)
    assert len(set(witness.values())) == 1, f"the pairs name different witnesses: {witness}"
    assert len(set(clusters.values())) == 1, f"the pairs join different clusters: {clusters}"
    (url,) = set(witness.values())
    etcd = one(docs, "Service", "pagesift-etcd")["metadata"]
    assert url == f"etcd://pagesift-etcd.{etcd['namespace']}.svc:2379"  # the shared etcd


def test_an_unexpanded_or_unknown_reference_in_a_nodes_arguments_is_caught() -> None:
    docs = rendered()
    sts = pair_sets(docs)["a"]
    assert expand("$(POD_NAME).x:$$(Y)", {"POD_NAME": "p"}) == "p.x:$(Y)"
    c = sts["spec"]["template"]["spec"]["containers"][0]
    c["env"] = [e for e in c["env"] if e["name"] != "PAGESIFT_PAIR"]
    with pytest.raises(AssertionError, match="unresolved"):
        node_argv(sts, 0)


def test_each_pairs_two_nodes_never_share_a_kubernetes_node_but_pairs_may() -> None:
    docs = rendered()
    for pair, sts in pair_sets(docs).items():
        anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname", pair
        # exactly this pair's pods: two pairs may share a machine, one pair's nodes never
        assert selected(term["labelSelector"], docs) == {f"StatefulSet/{sts['metadata']['name']}"}


def test_no_selector_of_one_pair_selects_another_pairs_pods() -> None:
    """Every Service, PDB, workload selector and anti-affinity term selects exactly its
    own workload's pods: pair a's Services never route to pair b's nodes."""
    docs = rendered()
    checked = 0
    for what, selector, owner in selectors(docs):
        got = selected(selector, docs)
        assert len(got) == 1, f"{what} selects {sorted(got) or 'no pods'}"
        if owner is not None:
            assert got == {owner}, f"{what} selects {sorted(got)}, not {owner}"
        checked += 1
    assert checked >= 5 * len(PAIRS)
    # the check bites: pair a's primary Service with the single-pair kit's selector
    # (no pair label) would route to every pair's nodes
    svc = one(docs, "Service", "pagesift-primary-a")
    svc["spec"]["selector"] = {"app.kubernetes.io/name": "pagesift"}
    assert len(selected(svc["spec"]["selector"], docs)) == len(PAIRS)


def test_only_the_nodes_the_gateway_and_the_auth_job_reach_etcds_client_port() -> None:
    docs = rendered()
    policy = one(docs, "NetworkPolicy", "pagesift-etcd")["spec"]
    assert selected(policy["podSelector"], docs) == {"StatefulSet/pagesift-etcd"}
    rules = {str(r["ports"]): r for r in policy["ingress"] if r.get("from")}
    assert sorted(rules) == [str([{"port": 2379}]), str([{"port": 2380}])]
    client, peer = rules[str([{"port": 2379}])], rules[str([{"port": 2380}])]
    admitted = set().union(*(selected(f["podSelector"], docs) for f in client["from"]))
    want = {f"StatefulSet/{s['metadata']['name']}" for s in pair_sets(docs).values()}
    assert admitted == want | {"Deployment/pagesift-gateway", "Job/pagesift-etcd-auth"}
    # the peer port: the members alone
    assert set().union(*(selected(f["podSelector"], docs) for f in peer["from"])) == {
        "StatefulSet/pagesift-etcd"
    }


def test_etcd_runs_three_members_that_name_each_other() -> None:
    docs = rendered()
    sts = one(docs, "StatefulSet", "pagesift-etcd")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["podManagementPolicy"] == "Parallel"
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    ns = sts["metadata"]["namespace"]
    flags = dict(a.split("=", 1) for a in c["command"][1:])
    members = [f"pagesift-etcd-{i}" for i in range(3)]
    peers = [
        f"{m}=http://{m}.{sts['spec']['serviceName']}.$(POD_NAMESPACE).svc:2380" for m in members
    ]
    assert flags["--initial-cluster"].split(",") == peers
    assert flags["--name"] == "$(POD_NAME)" and flags["--initial-cluster-state"] == "new"
    assert one(docs, "PodDisruptionBudget", "pagesift-etcd")["spec"]["maxUnavailable"] == 1
    assert ns == "pagesift"


def auth_job_args(docs: list[Doc]) -> Any:
    job = one(docs, "Job", "pagesift-etcd-auth")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["python", "-m", "pagesift.coord.etcdauth"]
    return etcdauth.parser().parse_args(c["args"])  # the real command's flags


def test_etcd_auth_gives_each_pair_a_user_limited_to_its_own_keys(tmp_path: Path) -> None:
    """The auth Job makes a user per pair of the kit and the gateway's reader, with the
    grants tests/test_registry_auth.py runs etcd with; every node logs in as its own
    pair's user with its own password item, and reads its own signing key."""
    docs = rendered()
    args = auth_job_args(docs)
    sets = pair_sets(docs)
    assert args.pairs.split(",") == sorted(sets)
    users = etcdauth.kit_users(args.cluster, args.pairs.split(","))
    assert sorted(users) == sorted([*sets, etcdauth.READER])
    job_pod = one(docs, "Job", "pagesift-etcd-auth")["spec"]["template"]["spec"]
    (volume,) = job_pod["volumes"]
    assert volume["secret"] == {"secretName": "pagesift-etcd-users", "defaultMode": 0o440}
    for pair, sts in sets.items():
        cfg = effective_config(node_spec(docs, sts, 0), tmp_path)
        assert args.cluster == cfg.cluster and parse_witness(args.etcd) == parse_witness(
            cfg.witness
        ), pair
        assert cfg.witness_user == pair, pair
        # a pair's role: its own witness and registry prefixes, nothing of another pair
        own = dict((prefix, perm) for perm, prefix in users[pair])
        for other in sets:
            if other != pair:
                assert not any(f"/{other}/" in prefix for prefix in own), (pair, other)
        env = pod_env(sts, container(sts, "pagesift"), f"{sts['metadata']['name']}-0")
        items = mounted_items(sts)
        assert items[cfg.witness_password_file] == ("pagesift-etcd-users", pair), pair
        assert items[env["PAGESIFT_CLUSTER_SIGNING_KEY_FILE"]] == (
            "pagesift-signing-keys",
            f"{pair}.key",
        ), pair


def mounted_items(sts: Doc) -> dict[str, tuple[str, str]]:
    """path in the container -> (Secret, key) of every Secret item the pod mounts."""
    c = container(sts, "pagesift")
    pod = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = {}
    for m in c["volumeMounts"]:
        secret = volumes.get(m["name"], {}).get("secret")  # "data": a claim template
        for item in (secret or {}).get("items", []):
            out[f"{m['mountPath']}/{item['path']}"] = (secret["secretName"], item["key"])
    return out


def test_the_members_file_lists_every_pair_at_the_addresses_its_nodes_advertise(
    tmp_path: Path,
) -> None:
    docs = rendered()
    cm = one(docs, "ConfigMap", "pagesift-members")
    text = cm["data"]["members.toml"]
    with pytest.raises(ValueError, match=r"pairs\.a\.public_key: is not base64"):
        parse_members(text)  # the placeholders are refused until replaced
    placeholders = re.findall(r'"REPLACE[^"]*"', text)
    assert len(placeholders) == len(PAIRS)
    for i, placeholder in enumerate(placeholders):
        key = base64.b64encode(bytes([i]) * 32).decode()
        text = text.replace(placeholder, f'"{key}"')
    members = parse_members(text)
    sets = pair_sets(docs)
    assert members.names == sorted(sets)
    for pair, sts in sets.items():
        advertised = []
        for ordinal in range(sts["spec"]["replicas"]):
            spec = node_spec(docs, sts, ordinal)
            cfg = effective_config(spec, tmp_path)
            advertised.append(cfg.advertise)
        member = members.get(pair)
        assert member is not None and list(member.nodes) == advertised, pair
        env = pod_env(sts, container(sts, "pagesift"), f"{sts['metadata']['name']}-0")
        c = container(sts, "pagesift")
        pod = sts["spec"]["template"]["spec"]
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "members"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "members"]
        assert volume["configMap"]["name"] == "pagesift-members"
        assert env["PAGESIFT_CLUSTER_MEMBERS"] == f"{mount['mountPath']}/members.toml"


def test_every_pod_runs_restricted_with_resources_probes_and_the_images_uid() -> None:
    image_uid = next(i.args for i in dockerfile() if i.keyword == "USER").split(":")[0]
    docs = rendered()
    workloads = of_kind(docs, "StatefulSet") + of_kind(docs, "Deployment")
    assert len(workloads) == len(PAIRS) + 2  # the pairs, etcd, the gateway
    for w in workloads:
        name = w["metadata"]["name"]
        pod = w["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, name
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        if name != "pagesift-etcd":
            assert str(sc["runAsUser"]) == image_uid, name
        for c in pod["containers"]:
            csc = c["securityContext"]
            assert csc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert csc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert csc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert csc.get("runAsNonRoot", True) is True, (name, c["name"])
            assert {"cpu", "memory"} <= c["resources"]["requests"].keys(), (name, c["name"])
            assert "memory" in c["resources"]["limits"], (name, c["name"])
            assert c.get("livenessProbe") and c.get("readinessProbe"), (name, c["name"])
    for sts in pair_sets(docs).values():
        c = container(sts, "pagesift")
        assert c["readinessProbe"]["exec"]["command"] == ["python", HEALTHCHECK, "pagesift.primary"]


def test_no_secret_values_are_committed_and_every_secret_has_its_create_line() -> None:
    docs = rendered()
    assert not of_kind(docs, "Secret")
    used = set()
    for w in of_kind(docs, "StatefulSet") + of_kind(docs, "Deployment"):
        for v in w["spec"]["template"]["spec"].get("volumes", []):
            if "secret" in v:
                used.add(v["secret"]["secretName"])
        for c in w["spec"]["template"]["spec"]["containers"]:
            for e in c.get("env", []):
                assert "secretKeyRef" not in e.get("valueFrom", {}), (w["metadata"]["name"], e)
    assert used == {
        "pagesift-secrets",
        "pagesift-tls",
        "pagesift-etcd-users",
        "pagesift-signing-keys",
    }
    header = (CLUSTER / "kustomization.yaml").read_text()
    for name in used:
        assert f"create secret generic {name}" in header, name


def test_one_image_runs_every_pagesift_container() -> None:
    docs = rendered()
    top = yaml.safe_load((CLUSTER / "kustomization.yaml").read_text())
    (image,) = top["images"]
    want = f"{image['newName']}:{image['newTag']}"
    containers = [container(s, "pagesift") for s in pair_sets(docs).values()]
    containers.append(container(gateway(), "gateway"))
    assert {c["image"] for c in containers} == {want}


def test_the_certificate_recipe_names_every_address_a_peer_a_client_or_the_probe_dials() -> None:
    text = re.sub(r"\\\n#\s*", " ", (CLUSTER / "kustomization.yaml").read_text())
    (line,) = [ln for ln in text.splitlines() if "make-certs.sh" in ln and "sh deploy" in ln]
    names = shlex.split(line.split("make-certs.sh", 1)[1].split("#")[0])[1:]  # after OUT_DIR
    docs = rendered()
    hosts = ["localhost", "pagesift-gateway.pagesift.svc"]
    for pair, sts in pair_sets(docs).items():
        for ordinal in range(sts["spec"]["replicas"]):
            argv = node_argv(sts, ordinal)
            (advertise,) = [a.split("=", 1)[1] for a in argv if a.startswith("--advertise=")]
            hosts.append(host_of(advertise))
        hosts.append(f"pagesift-primary-{pair}.pagesift.svc")
    for host in hosts:
        assert any(fnmatchcase(host, n) and n.count(".") == host.count(".") for n in names), host


# ================================================================ the gateway


def test_the_gateway_flags_exist_in_the_real_parser_and_its_files_are_mounted() -> None:
    g = gateway()
    c = container(g, "gateway")
    assert c["command"] == ["pagesift", "gateway"]
    argv = [str(a) for a in c["args"]]
    try:
        args, unknown = gateway_parser().parse_known_args(argv)
    except SystemExit:
        pytest.fail(f"`pagesift gateway` rejects {argv}")
    assert not unknown, f"`pagesift gateway` has no flag(s) {unknown}"
    # TLS on its port (API keys cross it), and the pairs reached over TLS
    assert host_of(args.listen) in WILDCARD_HOSTS and args.tls_cert and args.tls_key
    assert args.tls_ca
    mounts = [m["mountPath"] for m in c["volumeMounts"]]
    for path in (args.tls_cert, args.tls_key, args.tls_ca):
        assert any(path.startswith(m.rstrip("/") + "/") for m in mounts), path
    # the registry verified against the members file, read as the reader
    assert args.cluster_members and args.cluster_user == etcdauth.READER
    for path in (args.cluster_members, args.cluster_password_file):
        assert any(path.startswith(m.rstrip("/") + "/") for m in mounts), path
    volumes = {v["name"]: v for v in g["spec"]["template"]["spec"]["volumes"]}
    by_path = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    members_dir, _, _ = args.cluster_members.rpartition("/")
    assert by_path[members_dir]["configMap"]["name"] == "pagesift-members"
    password_dir, _, password_name = args.cluster_password_file.rpartition("/")
    assert by_path[password_dir]["secret"]["items"] == [
        {"key": etcdauth.READER, "path": password_name}
    ]
    # probes: ready on /healthz over TLS on the port it listens on; the Service targets it
    port = int(args.listen.rsplit(":", 1)[1])
    (named,) = [p for p in c["ports"] if p["containerPort"] == port]
    ready = c["readinessProbe"]["httpGet"]
    assert ready["path"] == "/healthz" and ready["scheme"] == "HTTPS"
    assert ready["port"] in (port, named["name"])
    assert c["livenessProbe"]["tcpSocket"]["port"] in (port, named["name"])
    svc = one(rendered(), "Service", "pagesift-gateway")["spec"]
    assert [p["targetPort"] for p in svc["ports"]] in ([port], [named["name"]])
    assert g["spec"]["replicas"] >= 2
    assert g["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_the_gateway_routes_through_the_cluster_the_nodes_join(tmp_path: Path) -> None:
    docs = rendered()
    args = gateway_parser().parse_args([str(a) for a in container(gateway(), "gateway")["args"]])
    assert args.cluster and not args.server, "the registry names the pairs, not --server"
    endpoints, name = parse_cluster_url(args.cluster)
    for sts in pair_sets(docs).values():
        cfg = effective_config(node_spec(docs, sts, 0), tmp_path)
        assert name == cfg.cluster, "the gateway watches another cluster than the nodes join"
        assert endpoints == parse_witness(cfg.witness), "the gateway reads another etcd"
