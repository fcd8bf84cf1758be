"""The deploy artefacts, checked by the tools that run here: hadolint (Dockerfile),
kubernetes-validate (manifests), check-jsonschema's compose-spec (compose file),
systemd-analyze (unit), promtool (alert rules and their unit tests); and checks of our own
that the pieces fit together (ports, probes, drain deadline, settings, metric names).

Each tool is also shown a broken copy, so that a check which silently passes everything
fails here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from relay.metrics import Metrics
from relay.settings import Settings, known_env_names

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
UNIT = ROOT / "deploy" / "systemd" / "outbox-relay.service"
MIGRATE_UNIT = UNIT.with_name("outbox-relay-migrate.service")
DASHBOARD = ROOT / "deploy" / "grafana" / "outbox-relay.json"
DEFAULTS = Settings.load({})


def tool(name: str) -> str:
    """A tool from the test environment (pip) or the system (apt); missing is a failure."""
    found = shutil.which(name, path=f"{Path(sys.executable).parent}:/usr/bin:/usr/sbin:/bin")
    assert found, f"{name} is not installed: run scripts/bootstrap test"
    return found


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, check=False
    )


def manifests() -> dict[str, list[dict[str, Any]]]:
    return {
        p.name: [d for d in yaml.safe_load_all(p.read_text()) if d]
        for p in sorted(KUBE.glob("*.yaml"))
    }


def kind(name: str) -> dict[str, Any]:
    found = [d for docs in manifests().values() for d in docs if d["kind"] == name]
    assert len(found) == 1, name
    return found[0]


# --- Dockerfile ---------------------------------------------------------------------------


def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    result = run(tool("hadolint"), ROOT / "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "Dockerfile"
    broken.write_text((ROOT / "Dockerfile").read_text().replace("USER 10001", "USER root"))
    assert "DL3002" in run(tool("hadolint"), broken).stdout  # the last user must not be root


def test_dockerfile_runs_as_non_root_with_a_healthcheck_and_the_console_script() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "USER 10001" in text and "HEALTHCHECK" in text and "/healthz" in text
    assert 'ENTRYPOINT ["relay"]' in text
    assert f":{DEFAULTS.metrics_port}/healthz" in text and f"EXPOSE {DEFAULTS.metrics_port}" in text


# --- Kubernetes ---------------------------------------------------------------------------


def test_kubernetes_manifests_pass_strict_schema_validation(tmp_path: Path) -> None:
    files = [p for p in sorted(KUBE.glob("*.yaml")) if p.name != "kustomization.yaml"]
    result = run(tool("kubernetes-validate"), "--strict", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" passed for resource ") >= 6
    broken = tmp_path / "deployment.yaml"
    broken.write_text((KUBE / "deployment.yaml").read_text().replace("replicas:", "replica:"))
    assert run(tool("kubernetes-validate"), "--strict", broken).returncode != 0


def test_kustomization_lists_every_manifest_but_the_example_secret() -> None:
    listed = set(yaml.safe_load((KUBE / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present - {"secret.example.yaml"}


def test_deployment_probes_ports_drain_and_sandbox_fit_the_relay() -> None:
    config = next(d for d in manifests()["configmap.yaml"] if d["kind"] == "ConfigMap")["data"]
    pod = kind("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    drain = float(config.get("RELAY_DRAIN_TIMEOUT", DEFAULTS.drain_timeout))
    assert pod["terminationGracePeriodSeconds"] > drain + 5
    port = int(config.get("RELAY_METRICS_PORT", DEFAULTS.metrics_port))
    assert container["ports"] == [{"name": "metrics", "containerPort": port}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert set(container["resources"]) == {"requests", "limits"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    # Secret files are read from a mounted Secret volume.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    # (The init container's owner password is a Secret volume the relay does not mount.)
    secret_volumes = {v["name"] for v in pod["volumes"] if "secret" in v} & mounts.keys()
    for env in container["env"]:
        if env["name"].endswith("_FILE"):
            assert any(env["value"].startswith(mounts[v] + "/") for v in secret_volumes), env
    topology = Path(config["RELAY_TOPOLOGY_FILE"])
    assert mounts["config"] == str(topology.parent) and "topology.toml" in config


def test_every_new_pod_migrates_the_schema_before_its_relay_starts() -> None:
    """`kubectl apply -k` applied a migration Job beside the Deployment, in no order, and a
    changed image on a finished Job is refused: new pods ran on the old schema, unready
    for ever (their turns fail), and the rollout stopped. The Deployment's pods run
    `relay migrate` first, from the relay's image, with the table owner's role, whose
    password only that init container mounts."""
    assert [d for docs in manifests().values() for d in docs if d["kind"] == "Job"] == []
    pod = kind("Deployment")["spec"]["template"]["spec"]
    (migrate,) = pod["initContainers"]
    (relay,) = pod["containers"]
    assert migrate["args"] == ["migrate"] and migrate["image"] == relay["image"]
    env = {e["name"]: e for e in migrate["env"]}
    url = env["RELAY_DATABASE_URL"]["valueFrom"]["configMapKeyRef"]
    (config,) = [d for d in manifests()["configmap.yaml"] if d["metadata"]["name"] == url["name"]]
    assert config["data"][url["key"]].startswith("postgresql://outbox_owner@")
    mounts = {m["name"]: m["mountPath"] for m in migrate["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (secret,) = mounts
    assert volumes[secret]["secret"]["secretName"] == "outbox-relay-migrate"
    assert env["RELAY_DATABASE_PASSWORD_FILE"]["value"].startswith(mounts[secret] + "/")
    assert secret not in {m["name"] for m in relay["volumeMounts"]}
    assert migrate["securityContext"] == relay["securityContext"]
    assert set(migrate["resources"]) == {"requests", "limits"}
    # The rollout waits for a new pod's readiness (its relay can work) before it stops an
    # old one.
    assert kind("Deployment")["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert relay["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_service_and_servicemonitor_select_the_relay_pods() -> None:
    pod_labels = kind("Deployment")["spec"]["template"]["metadata"]["labels"]
    service = kind("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    monitor = kind("ServiceMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["endpoints"]] == [service["spec"]["ports"][0]["name"]]


def test_every_relay_variable_in_the_deploy_files_is_a_real_setting() -> None:
    texts = [p.read_text() for p in (*KUBE.glob("*.yaml"), COMPOSE, UNIT, MIGRATE_UNIT)]
    named = {n for text in texts for n in re.findall(r"\bRELAY_[A-Z_]+\b", text)}
    assert len(named) >= 8
    assert sorted(named - set(known_env_names())) == []
    config = next(d for d in manifests()["configmap.yaml"] if d["kind"] == "ConfigMap")["data"]
    Settings.load({k: v for k, v in config.items() if k.startswith("RELAY_")})  # values parse


# --- Alerts and dashboard -----------------------------------------------------------------


def test_alert_rules_pass_promtool_check_and_their_unit_tests(tmp_path: Path) -> None:
    rules = tmp_path / "outbox-relay.rules.yml"
    rules.write_text(yaml.safe_dump(kind("PrometheusRule")["spec"]))
    checked = run(tool("promtool"), "check", "rules", rules)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shutil.copy(Path(__file__).with_name("alerts.test.yml"), tmp_path)
    tested = run(tool("promtool"), "test", "rules", tmp_path / "alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = {r["alert"] for g in kind("PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    tested_alerts = set(re.findall(r"alertname: (\w+)", (tmp_path / "alerts.test.yml").read_text()))
    assert alerts == tested_alerts
    broken = kind("PrometheusRule")["spec"]
    broken["groups"][0]["rules"][0]["expr"] = "max(relay_due_rows) >"
    rules.write_text(yaml.safe_dump(broken))
    assert run(tool("promtool"), "check", "rules", rules).returncode != 0


def exported_metrics() -> set[str]:
    families = Metrics().registry.collect()
    return {f.name + "_total" if f.type == "counter" else f.name for f in families}


def named_metrics(expressions: list[str]) -> set[str]:
    names = {n for e in expressions for n in re.findall(r"\brelay_[a-z_]+\b", e)}
    return {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}


def test_every_metric_an_alert_or_panel_names_is_exported() -> None:
    rules = kind("PrometheusRule")["spec"]["groups"]
    alert_exprs = [r["expr"] for g in rules for r in g["rules"]]
    panels = json.loads(DASHBOARD.read_text())["panels"]
    panel_exprs = [t["expr"] for p in panels for t in p["targets"]]
    exported = exported_metrics()
    assert sorted(named_metrics(alert_exprs) - exported) == []
    assert sorted(named_metrics(panel_exprs) - exported) == []
    # The dashboard shows every metric the relay exports.
    assert sorted(exported - named_metrics(panel_exprs)) == []


# --- Compose and systemd ------------------------------------------------------------------


def test_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    check = tool("check-jsonschema")
    result = run(check, "--builtin-schema", "vendor.compose-spec", COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("stop_grace_period: 45s", "stop_grace: 45s"))
    assert run(check, "--builtin-schema", "vendor.compose-spec", broken).returncode != 0


def test_compose_relay_waits_for_its_servers_and_reads_secrets_from_files() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    relay = compose["services"]["relay"]
    assert relay["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert relay["depends_on"]["rabbitmq"] == {"condition": "service_healthy"}
    env = relay["environment"]
    assert "RELAY_DATABASE_PASSWORD_FILE" in env and "RELAY_AMQP_PASSWORD_FILE" in env
    assert int(relay["stop_grace_period"].rstrip("s")) > DEFAULTS.drain_timeout
    for secret in compose["secrets"].values():
        assert (COMPOSE.parent / secret["file"]).is_file()


def verify_unit(path: Path, tmp_path: Path) -> str:
    """systemd-analyze verify's complaints about the unit (it exits 0 on most of them), with
    ExecStart pointing at this environment's relay so that the binary exists, beside the
    other shipped unit (the relay's requires the migration's)."""
    relay = Path(sys.executable).with_name("relay")
    for unit in (UNIT, MIGRATE_UNIT):
        if not (tmp_path / unit.name).exists():
            (tmp_path / unit.name).write_text(
                unit.read_text().replace("/usr/local/bin/relay", str(relay))
            )
    copy = tmp_path / path.name
    copy.write_text(path.read_text().replace("/usr/local/bin/relay", str(relay)))
    result = run(tool("systemd-analyze"), "verify", copy)
    assert result.returncode == 0 or result.stderr, result
    return "\n".join(line for line in result.stderr.splitlines() if copy.name in line)


SANDBOX = (
    "DynamicUser=yes",
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
    "MemoryDenyWriteExecute=yes",
)


def test_systemd_unit_verifies_and_is_sandboxed(tmp_path: Path) -> None:
    assert verify_unit(UNIT, tmp_path) == ""
    broken = tmp_path / "broken" / UNIT.name
    broken.parent.mkdir()
    broken.write_text(UNIT.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    assert "restart specifier" in verify_unit(broken, tmp_path / "broken")
    text = UNIT.read_text()
    for directive in (*SANDBOX, "Restart=on-failure", "EnvironmentFile=", "LoadCredential="):
        assert directive in text
    stop = int(re.search(r"TimeoutStopSec=(\d+)", text)[1])  # type: ignore[index]
    assert stop > DEFAULTS.drain_timeout + 5


def test_systemd_relay_starts_only_after_relay_migrate(tmp_path: Path) -> None:
    """Nothing ran `relay migrate` before a new version's relay started on the old schema.
    Every start of the relay's unit runs the migration's (a oneshot: again at each start)
    first, and does not start when it fails; the migration reads the table owner's URL and
    password from files of its own, not the relay's."""
    assert verify_unit(MIGRATE_UNIT, tmp_path) == ""
    relay, migrate = UNIT.read_text(), MIGRATE_UNIT.read_text()
    assert f"Requires={MIGRATE_UNIT.name}" in relay
    (after,) = re.findall(r"^After=(.*)$", relay, re.MULTILINE)
    assert MIGRATE_UNIT.name in after.split()
    assert "Type=oneshot" in migrate and "RemainAfterExit" not in migrate
    assert "ExecStart=/usr/local/bin/relay migrate\n" in migrate
    for directive in ("EnvironmentFile=", "LoadCredential="):
        (own,) = re.findall(rf"^{directive}(.*)$", migrate, re.MULTILINE)
        assert own not in relay, own
    for directive in SANDBOX:
        assert directive in migrate
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / UNIT.name).write_text(relay)  # without the migration's unit beside it
    assert (
        "outbox-relay-migrate.service not found"
        in run(tool("systemd-analyze"), "verify", broken / UNIT.name).stderr
    )
