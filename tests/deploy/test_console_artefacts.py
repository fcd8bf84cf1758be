"""The console's deploy artefacts (deploy/kubernetes/console/, its systemd unit) and the
relay's PodDisruptionBudget and NetworkPolicy, through the validators that run offline
(kubernetes-validate, systemd-analyze), each also shown a broken copy; and our own checks that
they fit the console (ports, probes, settings, not exposed outside the cluster)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from secrets import token_urlsafe
from typing import Any

import yaml

from relay.settings import ConsoleSettings, known_env_names

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
CONSOLE = KUBE / "console"
UNIT = ROOT / "deploy" / "systemd" / "outbox-relay-console.service"
USERS_DROP_IN = UNIT.with_name(UNIT.name + ".d") / "users-file.conf"


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{Path(sys.executable).parent}:/usr/bin:/usr/sbin:/bin")
    assert found, f"{name} is not installed: run scripts/bootstrap test"
    return found


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, check=False
    )


def doc(path: Path) -> dict[str, Any]:
    (found,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return dict(found)


def test_the_manifests_pass_strict_schema_validation(tmp_path: Path) -> None:
    files = [
        KUBE / "poddisruptionbudget.yaml",
        KUBE / "networkpolicy.yaml",
        *[p for p in sorted(CONSOLE.glob("*.yaml")) if p.name != "kustomization.yaml"],
    ]
    result = run(tool("kubernetes-validate"), "--strict", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" passed for resource ") == len(files)
    broken = tmp_path / "networkpolicy.yaml"
    text = (CONSOLE / "networkpolicy.yaml").read_text()
    broken.write_text(text.replace("policyTypes:", "policyType:"))
    assert run(tool("kubernetes-validate"), "--strict", broken).returncode != 0


def test_each_kustomization_lists_its_manifests_but_the_example_secret() -> None:
    for folder in (KUBE, CONSOLE):
        listed = set(yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"])
        present = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
        assert listed == present - {"secret.example.yaml"}, folder


def test_the_relays_budget_and_policy_select_its_pods_and_port() -> None:
    pod = doc(KUBE / "deployment.yaml")["spec"]["template"]
    labels = pod["metadata"]["labels"]
    budget = doc(KUBE / "poddisruptionbudget.yaml")["spec"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert budget["maxUnavailable"] == 1
    policy = doc(KUBE / "networkpolicy.yaml")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
    assert {p["port"] for rule in policy["ingress"] for p in rule["ports"]} <= ports


def test_the_console_deployment_fits_the_console_and_stays_inside_the_cluster() -> None:
    config = doc(CONSOLE / "configmap.yaml")["data"]
    pod = doc(CONSOLE / "deployment.yaml")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["args"] == ["console"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "http": int(config["RELAY_CONSOLE_PORT"]),
        "metrics": int(config["RELAY_CONSOLE_METRICS_PORT"]),
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    files = {e["name"]: e["value"] for e in container["env"] if e["name"].endswith("_FILE")}
    assert files and all(v.startswith(mounts["secrets"] + "/") for v in files.values())
    service = doc(CONSOLE / "service.yaml")["spec"]
    assert service["type"] == "ClusterIP"  # not exposed outside the cluster by default
    assert service["selector"].items() <= pod["metadata"]["labels"].items()
    # The settings load and the console would start with its secrets given (as files).
    secrets = {
        "RELAY_CONSOLE_SESSION_SECRET": token_urlsafe(48),
        "RELAY_CONSOLE_OIDC_CLIENT_SECRET": "y",
    }
    settings = ConsoleSettings.load({**config, **secrets})
    assert settings.problem() is None
    assert ConsoleSettings.load(config).problem() is not None  # without them it refuses
    # The example Secret's key is refused: whoever read it could sign an admin's cookie.
    example = doc(CONSOLE / "secret.example.yaml")["stringData"]["session-secret"]
    refused = ConsoleSettings.load({**config, **secrets, "RELAY_CONSOLE_SESSION_SECRET": example})
    assert refused.problem() is not None
    assert {n.removesuffix("_FILE") for n in files} >= set(secrets)


def test_every_relay_variable_in_the_console_files_is_a_real_setting() -> None:
    texts = [p.read_text() for p in (*CONSOLE.glob("*.yaml"), UNIT, USERS_DROP_IN)]
    named = {n for text in texts for n in re.findall(r"\bRELAY_[A-Z_]+\b", text)}
    assert len(named) >= 10
    assert sorted(named - set(known_env_names())) == []


def test_the_console_unit_verifies_and_is_sandboxed(tmp_path: Path) -> None:
    def complaints(path: Path, where: Path) -> str:
        copy = where / path.name
        relay = Path(sys.executable).with_name("relay")
        copy.write_text(path.read_text().replace("/usr/local/bin/relay", str(relay)))
        result = run(tool("systemd-analyze"), "verify", copy)
        return "\n".join(line for line in result.stderr.splitlines() if copy.name in line)

    assert complaints(UNIT, tmp_path) == ""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / UNIT.name).write_text(UNIT.read_text().replace("Restart=on-failure", "Restart=x"))
    assert "restart specifier" in complaints(broken / UNIT.name, broken)
    text = UNIT.read_text()
    for directive in ("DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict"):
        assert directive in text
    assert "ExecStart=/usr/local/bin/relay console" in text
    assert "RELAY_CONSOLE_SESSION_SECRET_FILE=%d/session-secret" in text
    # The users file (users mode) as a credential too, by a drop-in: a DynamicUser cannot
    # read /etc/outbox-relay; the unit with it verifies.
    drop_in = USERS_DROP_IN.read_text()
    assert "LoadCredential=console-users:/etc/outbox-relay/console-users" in drop_in
    assert "Environment=RELAY_CONSOLE_USERS_FILE=%d/console-users" in drop_in
    with_users = tmp_path / "with-users"
    (with_users / USERS_DROP_IN.parent.name).mkdir(parents=True)
    (with_users / USERS_DROP_IN.parent.name / USERS_DROP_IN.name).write_text(drop_in)
    assert complaints(UNIT, with_users) == ""
