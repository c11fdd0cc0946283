"""The deployment files in docker/ agree with the code they deploy.

No container is started (CI has no Docker engine): the files are parsed and checked against the CLI
parser, the settings table and the metric definitions, so a renamed command, setting, port or metric
fails here instead of in somebody's production stack.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from followups.cli import build_parser
from libs.common.core import metrics
from libs.common.core.settings import ENVIRONMENT, Settings, SettingsError

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"

#: Variables a followups container may set that are not in the settings table, each with its reader.
EXTRA_VARIABLES = frozenset(
    {
        "PROMETHEUS_MULTIPROC_DIR",  # prometheus-client multiprocess mode (libs/common/core/metrics.py)
    }
)
#: Variables the Dockerfile may set for the interpreter, pip and the virtual environment.
IMAGE_VARIABLES = frozenset(
    {
        "PATH",
        "VIRTUAL_ENV",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PIP_DISABLE_PIP_VERSION_CHECK",
        "PIP_NO_CACHE_DIR",
    }
)
#: Metric names of seed 000's Observability section, the only ones the alerts may use (besides `up`).
SEED_METRICS = frozenset(
    {
        "whatstig_followup_steps_total",
        "whatstig_followup_release_lag_seconds",
        "whatstig_followup_enrollments_total",
        "whatstig_followup_finished_total",
        "whatstig_followup_triggers_total",
        "whatstig_ai_requests_total",
        "last_job_success",
    }
)
#: Alerts seed 000 names.
SEED_ALERTS = frozenset({"FollowUpReleaseLagging", "FollowUpTriggerFailures", "FollowUpWorkerDown"})
#: Labels Prometheus attaches to every scraped series (`service` is set per target in prometheus.yml).
TARGET_LABELS = frozenset({"job", "instance", "service"})
#: PromQL words that look like metric names but are not.
PROMQL_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "inf", "nan"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


# -- loading ---------------------------------------------------------------------------------------


def _yaml(name: str) -> Any:
    with (DOCKER / name).open(encoding="utf-8") as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = _yaml("compose.yaml")
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def project_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The compose services that run the followups image (built from docker/Dockerfile)."""
    services: dict[str, dict[str, Any]] = compose["services"]
    built = {
        name: svc
        for name, svc in services.items()
        if isinstance(svc.get("build"), dict) and svc["build"].get("dockerfile") == "docker/Dockerfile"
    }
    images = {svc["image"] for svc in built.values() if "image" in svc}
    found = {name: svc for name, svc in services.items() if name in built or svc.get("image") in images}
    assert found, "no compose service builds docker/Dockerfile"
    return found


@pytest.fixture(scope="module")
def prometheus() -> dict[str, Any]:
    data = _yaml("prometheus.yml")
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def alert_rules() -> list[dict[str, Any]]:
    data = _yaml("alerts.yml")
    rules = [rule for group in data["groups"] for rule in group["rules"]]
    assert rules
    return rules


def _parse(command: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(command)
    except SystemExit:
        pytest.fail(f"the CLI rejects the compose command {command}")


def _worker_choices() -> set[str]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    worker = commands.choices["worker"]
    service = next(a for a in worker._actions if a.dest == "service")
    assert service.choices, "`followups worker` declares no service choices"
    return set(service.choices)


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.split("=", 1) for item in env)
        return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}
    return {
        key: "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in env.items()
    }


def _setting_default(name: str) -> Any:
    return next(v.default for vs in ENVIRONMENT.values() for v in vs if v.name == name)


def _by_command(project_services: dict[str, dict[str, Any]]) -> dict[str, argparse.Namespace]:
    return {name: _parse(svc["command"]) for name, svc in project_services.items()}


# -- compose ---------------------------------------------------------------------------------------


def test_project_services_build_from_the_repository_root(project_services: dict[str, dict[str, Any]]) -> None:
    for name, svc in project_services.items():
        build = svc.get("build")
        if build is None:
            continue
        assert (DOCKER / build["context"]).resolve() == ROOT, f"{name}: build context is not the repo root"
        assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE


def test_every_project_command_is_a_cli_command(project_services: dict[str, dict[str, Any]]) -> None:
    for name, svc in project_services.items():
        command = svc.get("command")
        assert isinstance(command, list) and command, f"{name}: give `command` as a non-empty list"
        assert _parse(command).command == command[0], name


def test_compose_runs_migrate_the_api_and_each_worker_once(
    project_services: dict[str, dict[str, Any]],
) -> None:
    parsed = _by_command(project_services).values()
    assert [ns.command for ns in parsed].count("migrate") == 1
    assert [ns.command for ns in parsed].count("api") == 1
    workers = sorted(ns.service for ns in parsed if ns.command == "worker")
    # Every service the CLI can run as a worker has exactly one container, and no container runs
    # anything else.
    assert workers == sorted(_worker_choices())


def test_api_listens_on_all_interfaces_and_publishes_its_port(
    project_services: dict[str, dict[str, Any]],
) -> None:
    name, ns = next((n, ns) for n, ns in _by_command(project_services).items() if ns.command == "api")
    env = _environment(project_services[name])
    host = getattr(ns, "host", None) or env.get("API_HOST") or _setting_default("API_HOST")
    port = getattr(ns, "port", None) or env.get("API_PORT") or _setting_default("API_PORT")
    assert host == "0.0.0.0", "inside a container the API must listen on every interface"
    published = {str(p).rsplit(":", 1)[-1] for p in project_services[name].get("ports", [])}
    assert str(port) in published


def test_project_environment_names_only_known_settings(project_services: dict[str, dict[str, Any]]) -> None:
    known = {v.name for vs in ENVIRONMENT.values() for v in vs}
    for name, svc in project_services.items():
        env = _environment(svc)
        unknown = set(env) - known - EXTRA_VARIABLES
        assert not unknown, f"{name} sets variables the product does not read: {sorted(unknown)}"
        assert {"DATABASE_URL", "AMQP_URL"} <= set(env), f"{name} needs PostgreSQL and RabbitMQ"
        try:
            Settings.from_env(env)
        except SettingsError as exc:
            pytest.fail(f"{name}: {exc}")


def test_long_running_services_wait_for_the_migration(
    compose: dict[str, Any], project_services: dict[str, dict[str, Any]]
) -> None:
    services: dict[str, dict[str, Any]] = compose["services"]
    parsed = _by_command(project_services)
    migrate = next(name for name, ns in parsed.items() if ns.command == "migrate")
    assert project_services[migrate].get("restart", "no") == "no", "a one-shot must not be restarted"
    assert project_services[migrate]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, ns in parsed.items():
        if ns.command in {"api", "worker"}:
            depends = project_services[name].get("depends_on", {})
            assert depends.get(migrate, {}).get("condition") == "service_completed_successfully", name
    # A `service_healthy` condition on a service without a healthcheck would block forever.
    for name, svc in services.items():
        depends = svc.get("depends_on", {})
        for dependency, spec in depends.items() if isinstance(depends, dict) else ():
            assert dependency in services, f"{name} depends on an unknown service {dependency}"
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"


# -- Dockerfile ------------------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of the Dockerfile, continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    pairs = []
    for text in logical:
        keyword, _, args = text.strip().partition(" ")
        pairs.append((keyword.upper(), args.strip()))
    return pairs


def _copy_sources(args: str) -> list[str]:
    words = [w for w in shlex.split(args) if not w.startswith("--")]
    return [w.rstrip("/") or "." for w in words[:-1]]


def test_dockerfile_installs_dependencies_before_copying_the_source() -> None:
    instructions = _instructions()
    stages = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    assert len(stages) >= 2, "build in one stage and copy the result into a runtime stage"
    copies: dict[str, int] = {}  # source -> index of the first COPY of it
    for i, (keyword, args) in enumerate(instructions):
        if keyword == "COPY" and "--from" not in args:
            for source in _copy_sources(args):
                copies.setdefault(source, i)
    assert "pyproject.toml" in copies
    with (ROOT / "pyproject.toml").open("rb") as f:
        packages = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    package_dirs = {pattern.rstrip("*") for pattern in packages}
    assert package_dirs <= set(copies), f"the image must copy every package: {sorted(package_dirs)}"
    first_source = min(copies[d] for d in package_dirs)
    dependency_install = [
        i
        for i, (keyword, args) in enumerate(instructions)
        if keyword == "RUN" and "pip install" in args and copies["pyproject.toml"] < i < first_source
    ]
    assert dependency_install, "install the dependencies between COPY pyproject.toml and the source"
    for source in copies:
        assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the repository"


def test_runtime_stage_runs_followups_as_a_non_root_user() -> None:
    instructions = _instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    runtime = instructions[last_from:]
    assert any(k == "COPY" and "--from=" in a for k, a in runtime), "copy the venv from the builder"
    users = [a.split(":")[0] for k, a in runtime if k == "USER"]
    assert users and users[-1] not in {"root", "0"}, "the runtime stage must end as a non-root user"
    entrypoints = [a for k, a in runtime if k == "ENTRYPOINT"]
    assert entrypoints and yaml.safe_load(entrypoints[-1]) == ["followups"]


def test_dockerfile_sets_only_known_variables() -> None:
    known = {v.name for vs in ENVIRONMENT.values() for v in vs}
    names = set()
    for keyword, args in _instructions():
        if keyword == "ENV":
            words = shlex.split(args)
            names |= {w.split("=", 1)[0] for w in words} if "=" in words[0] else {words[0]}
    assert names, "the Dockerfile sets no environment at all (PATH to the venv is expected)"
    assert not names - known - EXTRA_VARIABLES - IMAGE_VARIABLES


def test_dockerignore_keeps_out_local_state_but_not_the_sources() -> None:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [p.strip() for p in lines if p.strip() and not p.startswith(("#", "!"))]
    assert {".git", ".venv"} <= set(patterns)
    sources = {s for k, a in _instructions() if k == "COPY" and "--from" not in a for s in _copy_sources(a)}
    for source in sources:
        hidden = [p for p in patterns if fnmatch.fnmatch(source, p.rstrip("/"))]
        assert not hidden, f".dockerignore hides {source}, which the Dockerfile copies ({hidden})"


# -- Prometheus ------------------------------------------------------------------------------------


def _targets(prometheus: dict[str, Any]) -> Iterator[tuple[str, str, int]]:
    """(job, host, port) of every static scrape target."""
    for job in prometheus["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                yield job["job_name"], host, int(port)


def test_prometheus_scrapes_the_api_and_every_worker_on_their_ports(
    compose: dict[str, Any], project_services: dict[str, dict[str, Any]], prometheus: dict[str, Any]
) -> None:
    scraped = {(host, port) for _, host, port in _targets(prometheus)}
    unknown = {host for host, _ in scraped} - set(compose["services"])
    assert not unknown, f"prometheus.yml scrapes hosts that are not compose services: {sorted(unknown)}"
    for name, ns in _by_command(project_services).items():
        env = _environment(project_services[name])
        if ns.command == "api":
            port = int(getattr(ns, "port", None) or env.get("API_PORT") or _setting_default("API_PORT"))
        elif ns.command == "worker":
            port = int(env.get("WORKER_METRICS_PORT") or _setting_default("WORKER_METRICS_PORT"))
        else:
            continue
        assert (name, port) in scraped, f"prometheus.yml does not scrape {name}:{port}"


def test_prometheus_loads_the_alerts_it_is_given(compose: dict[str, Any], prometheus: dict[str, Any]) -> None:
    service = next(svc for svc in compose["services"].values() if "prom/prometheus" in svc.get("image", ""))
    mounts = {m.split(":")[1]: m.split(":")[0] for m in service.get("volumes", []) if m.startswith("./")}
    assert mounts.get("/etc/prometheus/prometheus.yml") == "./prometheus.yml"
    assert prometheus["rule_files"]
    for rule_file in prometheus["rule_files"]:
        mounted = mounts.get(f"/etc/prometheus/{rule_file}")
        assert mounted, f"{rule_file} is not mounted next to prometheus.yml"
        assert (DOCKER / mounted).is_file()


# -- alerts ----------------------------------------------------------------------------------------


def _metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (histogram series folded to their family)."""
    bare = re.sub(r"\{[^}]*\}", " ", expr)
    bare = re.sub(r"\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    names = set(re.findall(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(?![\w:]|\s*\()", bare)) - PROMQL_KEYWORDS
    folded = set()
    for name in names:
        suffix = next((s for s in HISTOGRAM_SUFFIXES if name.endswith(s)), None)
        family = name.removesuffix(suffix) if suffix else name
        folded.add(family if suffix and (family in SEED_METRICS or family in _product_metrics()) else name)
    return folded


def _selectors(expr: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(metric name, {label: value}) of every selector with label matchers."""
    for match in re.finditer(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", expr):
        labels = dict(re.findall(r'([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*"([^"]*)"', match.group(2)))
        yield match.group(1), labels


def _product_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Exposed name -> (type, label names) of every metric libs.common.core.metrics defines."""
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            kind = str(value._type)
            suffix = "_total" if kind == "counter" else ""
            found[value._name + suffix] = (kind, tuple(value._labelnames))
    return found


def test_metric_name_parsing_is_not_fooled_by_functions_and_clauses() -> None:
    expr = 'histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{x="y"}[5m]))) > 1e3 and on() up'
    assert _metric_names(expr) == {"a_seconds_bucket", "up"}
    assert _metric_names("time() - max(last_job_success) > 26 * 3600") == {"last_job_success"}


def test_alerts_cover_the_seed_and_the_seeds_alerts_use_seed_metrics(
    alert_rules: list[dict[str, Any]],
) -> None:
    names = {rule["alert"] for rule in alert_rules}
    assert names >= SEED_ALERTS
    for rule in alert_rules:
        used = _metric_names(rule["expr"])
        assert used, f"{rule['alert']}: no metric found in {rule['expr']!r}"
        if rule["alert"] in SEED_ALERTS:
            unknown = used - SEED_METRICS - {"up"}
            assert not unknown, f"{rule['alert']} uses metrics the seed does not name: {unknown}"
        assert rule.get("for"), f"{rule['alert']}: give it a `for` so one bad scrape does not page"
        assert rule.get("annotations", {}).get("summary"), f"{rule['alert']} has no summary"
    retention = [
        rule
        for rule in alert_rules
        if any(
            m == "last_job_success" and labels.get("job") == "followup-retention"
            for m, labels in _selectors(rule["expr"])
        )
        and "26" in rule["expr"]
    ]
    assert retention, "an alert must fire when followup-retention has not succeeded for 26 hours"


def _slug(heading: str) -> str:
    """A markdown heading's anchor, as GitHub makes it."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_runbook_in_the_operations_doc(alert_rules: list[dict[str, Any]]) -> None:
    operations = (DOCKER.parent / "docs" / "operations.md").read_text(encoding="utf-8")
    anchors = {_slug(line.lstrip("#")) for line in operations.splitlines() if line.startswith("#")}
    for rule in alert_rules:
        url = rule.get("annotations", {}).get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path == "docs/operations.md", (
            f"{rule['alert']}: runbook_url {url!r} is not docs/operations.md#..."
        )
        assert anchor in anchors, f"{rule['alert']}: docs/operations.md has no section #{anchor}"


def test_alerts_select_metrics_and_labels_the_product_exports(alert_rules: list[dict[str, Any]]) -> None:
    product = _product_metrics()
    for rule in alert_rules:
        for name in _metric_names(rule["expr"]) - {"up"}:
            assert name in product, f"{rule['alert']}: libs.common.core.metrics does not define {name}"
        for name, labels in _selectors(rule["expr"]):
            family = next(
                (name.removesuffix(s) for s in HISTOGRAM_SUFFIXES if name.removesuffix(s) in product), name
            )
            if family not in product:
                continue
            kind, label_names = product[family]
            allowed = set(label_names) | TARGET_LABELS | ({"le"} if kind == "histogram" else set())
            assert set(labels) <= allowed, f"{rule['alert']}: {name} has no label {set(labels) - allowed}"


def test_up_alerts_select_real_scrape_jobs(
    alert_rules: list[dict[str, Any]], prometheus: dict[str, Any]
) -> None:
    jobs = {job["job_name"] for job in prometheus["scrape_configs"]}
    up_selectors = [
        (rule["alert"], labels["job"])
        for rule in alert_rules
        for name, labels in _selectors(rule["expr"])
        if name == "up" and "job" in labels
    ]
    assert up_selectors
    for alert, job_matcher in up_selectors:
        assert any(re.fullmatch(job_matcher, job) for job in jobs), (
            f"{alert} selects job {job_matcher!r}, which prometheus.yml does not scrape"
        )


def test_worker_down_watches_exactly_the_worker_containers(
    alert_rules: list[dict[str, Any]],
    prometheus: dict[str, Any],
    project_services: dict[str, dict[str, Any]],
) -> None:
    worker_down = next(rule for rule in alert_rules if rule["alert"] == "FollowUpWorkerDown")
    job_matcher = dict(_selectors(worker_down["expr"]))["up"]["job"]
    watched = {host for job, host, _ in _targets(prometheus) if re.fullmatch(job_matcher, job)}
    workers = {name for name, ns in _by_command(project_services).items() if ns.command == "worker"}
    assert watched == workers
