"""deploy/: the Kubernetes manifests against the API's models, the systemd units with
systemd-analyze, and the dashboard and alerts against the metrics the daemon exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpreempt.daemon.prometheus import DEFAULT_METRICS_PORT, DaemonMetrics, TaskSample

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))


def _documents(path: Path) -> list[dict]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (pip install -e '.[dev]')")
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _strip_nulls(value):
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_manifests_match_the_kubernetes_api(path: Path) -> None:
    """Each object deserializes into the API model of its kind with every required field, and
    no field is lost on the way (a misspelt or misplaced key would be)."""
    kubernetes = pytest.importorskip(
        "kubernetes", reason="the kubernetes client is not installed (pip install -e '.[dev]')"
    )
    client = kubernetes.client.ApiClient()

    class Response:
        def __init__(self, doc: dict) -> None:
            self.data = json.dumps(doc)

    for doc in _documents(path):
        group_version = doc["apiVersion"].split("/")[-1]
        model = f"{group_version.capitalize()}{doc['kind']}"
        assert hasattr(kubernetes.client, model), f"{path.name}: unknown kind {model}"
        try:  # clients from v37 take the text and a content type, older ones a response
            obj = client.deserialize(json.dumps(doc), model, "application/json")
        except TypeError:
            obj = client.deserialize(Response(doc), model)
        back = _strip_nulls(client.sanitize_for_serialization(obj))
        assert back == doc, f"{path.name}: {doc['kind']} has fields the API does not know"


def test_every_port_is_the_default_metrics_port() -> None:
    port = str(DEFAULT_METRICS_PORT)
    daemonset = next(
        d for d in _documents(DEPLOY / "kubernetes" / "gpreempt.yaml") if d["kind"] == "DaemonSet"
    )
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"][0]["containerPort"] == DEFAULT_METRICS_PORT
    assert port in container["args"]
    assert f"--metrics-port {port}" in (DEPLOY / "systemd" / "gpreempt.service").read_text()
    # the image's default command uses the default port (--metrics-port alone)
    assert '"--metrics-port", "--metrics-addr", "0.0.0.0"' in (DEPLOY / "Containerfile").read_text()


@pytest.mark.parametrize("unit", ["gpreempt.service", "gpreempt-user.service"])
def test_systemd_units_verify_clean(unit: str, tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    text = (DEPLOY / "systemd" / unit).read_text()
    # the units name where pip puts the command; verify against this Python's
    here = f"{sys.executable} -m gpreempt"
    text = text.replace("/usr/local/bin/gpreempt", here).replace("%h/.local/bin/gpreempt", here)
    copy = tmp_path / unit
    copy.write_text(text)
    command = ["systemd-analyze", "verify", str(copy)]
    env = None
    if "user" in unit:
        runtime = tmp_path / "xdg"
        runtime.mkdir(mode=0o700)
        command.insert(1, "--user")
        env = {"XDG_RUNTIME_DIR": str(runtime), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stderr


def _exported_names() -> set[str]:
    m = DaemonMetrics()
    m.on_suspend(0, "t", "gate", 0.001)
    m.on_suspend_failed(0, "t", "gate")
    m.on_turn(0, "t")
    m.on_evict(0, "t", 1, 0.1)
    m.on_restore(0, "t", 1, 0.1)
    m.publish([TaskSample(0, "t", "suspended", 1.0, 0.0)])
    text = m.render().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def test_dashboard_and_alerts_use_only_exported_metrics() -> None:
    exported = _exported_names()
    dashboard = json.loads((DEPLOY / "monitoring" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = _documents(DEPLOY / "monitoring" / "alerts.yaml")[0]["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == {
        "GpreemptTaskSuspendedTooLong",
        "GpreemptSuspensionsFailing",
    }
    exprs += [r["expr"] for r in rules]
    used = {name for e in exprs for name in re.findall(r"gpreempt_[a-z_]+", e)}
    assert used and used <= exported, used - exported


#: What a root daemon needs to serve pods of other uids (measured: a daemon confined to KILL
#: and SYS_PTRACE refuses every non-root pod's channel, "cannot make the control block
#: private"; with FOWNER added it takes it): see the comment in gpreempt.yaml.
NEEDED_CAPS = {"KILL", "SYS_PTRACE", "FOWNER", "DAC_READ_SEARCH", "SETUID"}


def test_the_daemonset_can_serve_non_root_pods_with_the_fewest_capabilities() -> None:
    (daemonset,) = [
        d for d in _documents(DEPLOY / "kubernetes" / "gpreempt.yaml") if d["kind"] == "DaemonSet"
    ]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    caps = container["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    assert set(caps["add"]) == NEEDED_CAPS


def test_the_systemd_unit_bounds_the_daemon_to_what_it_needs() -> None:
    text = (DEPLOY / "systemd" / "gpreempt.service").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("CapabilityBoundingSet=")]
    bound = {c.removeprefix("CAP_") for c in line.split("=", 1)[1].split()}
    assert bound >= NEEDED_CAPS


def _pod_spec(doc: dict) -> dict:
    """The pod template's spec of a workload object (Deployment, Job, DaemonSet...)."""
    spec = doc.get("spec", {})
    return spec.get("template", {}).get("spec", spec) if doc.get("kind") != "Pod" else spec


def _runtime_mounts(path: Path) -> list[tuple[str, dict]]:
    """(kind, volume mount) for every mount of the node's runtime directory (a hostPath
    volume of /run/gpreempt) in ``path``'s objects."""
    found = []
    for doc in _documents(path):
        pod = _pod_spec(doc)
        volumes = {
            v["name"]
            for v in pod.get("volumes", [])
            if v.get("hostPath", {}).get("path") == "/run/gpreempt"
        }
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            found += [
                (doc["kind"], m) for m in container.get("volumeMounts", []) if m["name"] in volumes
            ]
    return found


def test_workloads_mount_the_runtime_directory_read_only() -> None:
    # a client only connects to the daemon's socket (tests/test_read_only_mount.py): a
    # workload, root in its container as most are, cannot touch the daemon's files
    workloads = [p for p in MANIFESTS if p.name != "gpreempt.yaml"]
    assert workloads
    for path in workloads:
        mounts = _runtime_mounts(path)
        assert mounts, f"{path.name} does not mount the runtime directory"
        for kind, mount in mounts:
            assert mount.get("readOnly") is True, f"{path.name}: {kind} mounts it writable"
    # the daemon alone writes there
    daemon = _runtime_mounts(DEPLOY / "kubernetes" / "gpreempt.yaml")
    assert [m.get("readOnly", False) for _kind, m in daemon] == [False]
    # and the opt-in that docs/deploy.md shows is read-only too
    guide = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    shown = re.findall(r"volumeMounts: \[(\{.*?\})\]", guide)
    assert shown and all("readOnly: true" in mount for mount in shown), shown
