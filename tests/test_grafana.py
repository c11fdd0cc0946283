"""The Grafana dashboards and provisioning in docker/grafana/ agree with the metrics and the compose file.

Nothing is started (as in tests/test_docker.py, whose PromQL helpers this reuses): every dashboard query
must select metrics and labels libs.common.core.metrics defines, every panel must use the provisioned
datasource, and the compose `grafana` service must mount the folders the provisioning files point at, so a
renamed metric or label, or a moved file, fails here instead of as an empty panel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_docker import (
    DOCKER,
    HISTOGRAM_SUFFIXES,
    TARGET_LABELS,
    _metric_names,
    _product_metrics,
    _selectors,
    _targets,
    _yaml,
)

GRAFANA = DOCKER / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
PROVISIONING = GRAFANA / "provisioning"
#: Where the Grafana image reads its provisioning files from.
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"
#: Panel types the dashboards may use (each queries Prometheus); rows only group them.
DATA_PANELS = frozenset({"timeseries", "stat", "gauge", "bargauge", "table", "heatmap"})
#: PromQL functions whose argument must be a counter (or a histogram series, itself counters).
RATE_FUNCTIONS = ("rate", "irate", "increase")
#: Aggregation operators that keep only the labels of their `by` clause (none without one).
AGGREGATIONS = ("sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "quantile")
#: Panels the brief for the dashboard asks for: a metric each must show.
REQUIRED_METRICS = frozenset(
    {
        "whatstig_followup_steps_total",
        "whatstig_followup_release_lag_seconds",
        "whatstig_followup_finished_total",
        "whatstig_followup_enrollments_total",
        "whatstig_followup_triggers_total",
        "whatstig_rule_executions_total",
        "whatstig_rule_execution_lag_seconds",
        "whatstig_rule_pending_executions",
        "whatstig_webhook_deliveries_total",
        "whatstig_ai_requests_total",
        "followups_api_throttled_total",
        "followups_api_auth_refusals_total",
        "followups_outbox_oldest_unpublished_seconds",
        "followups_outbox_published_total",
        "whatstig_retention_rows_deleted_total",
        "last_job_success",
        "followups_actor_messages_total",
        "up",
    }
)

Target = tuple[str, dict[str, Any]]  # (panel title, Prometheus target)


# -- loading ---------------------------------------------------------------------------------------


def _provisioning(kind: str) -> list[dict[str, Any]]:
    """The provisioning documents of one kind (datasources, dashboards), each file parsed."""
    files = sorted((PROVISIONING / kind).glob("*.y*ml"))
    assert files, f"docker/grafana/provisioning/{kind}/ holds no provisioning file"
    documents = []
    for path in files:
        with path.open(encoding="utf-8") as f:
            data = yaml.safe_load(f)
        assert isinstance(data, dict) and data.get("apiVersion") == 1, f"{path.name}: apiVersion 1 expected"
        documents.append(data)
    return documents


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> parsed dashboard, for every JSON file the dashboard provider loads."""
    found = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(data, dict), f"{path.name} is not a dashboard object"
        found[path.name] = data
    assert "followups.json" in found
    return found


@pytest.fixture(scope="module")
def datasource() -> dict[str, Any]:
    """The provisioned Prometheus datasource."""
    sources = [s for doc in _provisioning("datasources") for s in doc.get("datasources", [])]
    prometheus = [s for s in sources if s.get("type") == "prometheus"]
    assert len(prometheus) == 1, "provision exactly one Prometheus datasource"
    found: dict[str, Any] = prometheus[0]
    return found


@pytest.fixture(scope="module")
def providers() -> list[dict[str, Any]]:
    found = [p for doc in _provisioning("dashboards") for p in doc.get("providers", [])]
    assert found, "no dashboard provider is provisioned"
    return found


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = _yaml("compose.yaml")
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def grafana(compose: dict[str, Any]) -> dict[str, Any]:
    found = [s for s in compose["services"].values() if str(s.get("image", "")).startswith("grafana/")]
    assert len(found) == 1, "compose.yaml needs exactly one Grafana service"
    service: dict[str, Any] = found[0]
    return service


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows and the panels of collapsed rows included."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _data_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in _panels(dashboard["panels"]) if p.get("type") != "row"]


def _prometheus_targets(dashboards: dict[str, dict[str, Any]]) -> list[Target]:
    found = [
        (f"{name}: {panel.get('title')}", target)
        for name, dashboard in dashboards.items()
        for panel in _data_panels(dashboard)
        for target in panel.get("targets", [])
    ]
    assert found
    return found


# -- PromQL ----------------------------------------------------------------------------------------


def _masked(expr: str) -> str:
    """The expression with string literals blanked (same length), so their brackets do not count."""
    return re.sub(r'"[^"]*"', lambda m: '"' + "_" * (len(m.group()) - 2) + '"', expr)


def _closing(expr: str, start: int) -> int:
    """The index of the bracket matching the one at ``start`` (searching backwards from a `)`)."""
    pairs = {"(": ")", ")": "("}
    step = 1 if expr[start] == "(" else -1
    depth = 0
    i = start
    while 0 <= i < len(expr):
        if expr[i] == expr[start]:
            depth += 1
        elif expr[i] == pairs[expr[start]]:
            depth -= 1
            if depth == 0:
                return i
        i += step
    raise AssertionError(f"unbalanced brackets in {expr!r}")


def _aggregations(expr: str) -> Iterator[tuple[str | None, set[str], str]]:
    """(clause: "by", "without" or None; its labels; the aggregated expression) of every aggregation.

    Both clause positions are found: ``sum by (a) (body)`` and ``sum(body) by (a)``.
    """
    masked = _masked(expr)
    clause = r"\b(by|without)\s*\(([^)]*)\)\s*"
    for match in re.finditer(rf"\b(?:{'|'.join(AGGREGATIONS)})\s*(?:{clause})?\(", masked):
        start = match.end() - 1
        end = _closing(masked, start) + 1
        kind, labels = match.group(1), match.group(2)
        if kind is None and (after := re.match(rf"\s*{clause}", masked[end:])):
            kind, labels = after.group(1), after.group(2)
        names = {label.strip() for label in (labels or "").split(",") if label.strip()}
        yield kind, names, expr[start:end]


def _calls(expr: str, functions: tuple[str, ...]) -> Iterator[tuple[int, int, int]]:
    """(start of the call, start of its arguments, end) of every call of one of ``functions``."""
    masked = _masked(expr)
    for match in re.finditer(rf"\b(?:{'|'.join(functions)})\s*\(", masked):
        yield match.start(), match.end() - 1, _closing(masked, match.end() - 1) + 1


def _family(name: str, product: dict[str, tuple[str, tuple[str, ...]]]) -> str:
    return next((name.removesuffix(s) for s in HISTOGRAM_SUFFIXES if name.removesuffix(s) in product), name)


def _labels_of(name: str, product: dict[str, tuple[str, tuple[str, ...]]]) -> set[str]:
    """The labels a series of ``name`` (`up`, a product metric or a histogram series) carries."""
    if name == "up":
        return set(TARGET_LABELS)
    kind, label_names = product[_family(name, product)]
    return set(label_names) | TARGET_LABELS | ({"le"} if kind == "histogram" else set())


def test_aggregation_parser_finds_both_clause_forms_and_their_bodies() -> None:
    expr = 'histogram_quantile(0.9, sum by (le, a) (rate(x_bucket{j=~"(p|q)"}[5m]))) / sum(y) without (b)'
    assert list(_aggregations(expr)) == [
        ("by", {"le", "a"}, '(rate(x_bucket{j=~"(p|q)"}[5m]))'),
        ("without", {"b"}, "(y)"),
    ]
    assert list(_aggregations("time() - max(max_over_time(z[1h]))")) == [
        (None, set(), "(max_over_time(z[1h]))")
    ]
    assert [expr[s:e] for s, _, e in _calls(expr, RATE_FUNCTIONS)] == ['rate(x_bucket{j=~"(p|q)"}[5m])']


# -- dashboards ------------------------------------------------------------------------------------


def test_dashboards_are_provisionable(dashboards: dict[str, dict[str, Any]]) -> None:
    uids = [d.get("uid") for d in dashboards.values()]
    assert all(uids) and len(set(uids)) == len(uids), "give every dashboard its own uid"
    for name, dashboard in dashboards.items():
        assert dashboard.get("title"), f"{name} has no title"
        assert dashboard.get("id") is None, f"{name}: a provisioned dashboard must not carry a database id"
        assert isinstance(dashboard.get("schemaVersion"), int) and dashboard["schemaVersion"] >= 36, name
        assert isinstance(dashboard.get("panels"), list) and _data_panels(dashboard), f"{name} has no panel"


def test_panel_ids_are_unique_and_panels_fit_the_grid(dashboards: dict[str, dict[str, Any]]) -> None:
    for name, dashboard in dashboards.items():
        ids: list[Any] = [panel.get("id") for panel in _panels(dashboard["panels"])]
        assert all(isinstance(i, int) for i in ids), f"{name}: every panel needs an integer id"
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        assert not duplicates, f"{name}: panel ids {duplicates} are used twice"
        taken: dict[tuple[int, int], str] = {}
        for panel in dashboard["panels"]:  # the top level; collapsed rows lay theirs out when opened
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, f"{name}: {panel['title']}"
            for cell in (
                (x, y)
                for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])
            ):
                assert cell not in taken, f"{name}: {panel['title']} overlaps {taken[cell]}"
                taken[cell] = panel["title"]


def test_every_panel_queries_prometheus(dashboards: dict[str, dict[str, Any]]) -> None:
    for name, dashboard in dashboards.items():
        for panel in _data_panels(dashboard):
            title = f"{name}: {panel.get('title')}"
            assert panel.get("type") in DATA_PANELS, f"{title}: unexpected panel type {panel.get('type')}"
            targets = panel.get("targets", [])
            assert any(str(t.get("expr", "")).strip() for t in targets), f"{title} has no query"
            ref_ids = [t.get("refId") for t in targets]
            assert all(ref_ids) and len(set(ref_ids)) == len(ref_ids), f"{title}: refIds must be unique"


def test_panels_use_the_provisioned_datasource(
    dashboards: dict[str, dict[str, Any]], datasource: dict[str, Any]
) -> None:
    assert datasource.get("uid"), "give the Prometheus datasource a fixed uid for the dashboards to use"
    for name, dashboard in dashboards.items():
        for panel in _data_panels(dashboard):
            for owner in [panel, *panel.get("targets", [])]:
                selected = owner.get("datasource")
                assert isinstance(selected, dict), f"{name}: {panel.get('title')} names no datasource"
                assert selected.get("type") == "prometheus", f"{name}: {panel.get('title')}"
                assert selected.get("uid") == datasource["uid"], (
                    f"{name}: {panel.get('title')} uses datasource {selected.get('uid')!r}, "
                    f"the provisioned one is {datasource['uid']!r}"
                )


def test_the_dashboard_covers_the_products_metrics(dashboards: dict[str, dict[str, Any]]) -> None:
    used = {n for _, t in _prometheus_targets(dashboards) for n in _metric_names(t["expr"])}
    assert not REQUIRED_METRICS - used, f"no panel shows {sorted(REQUIRED_METRICS - used)}"


# -- queries against the metrics -------------------------------------------------------------------


def test_queries_select_only_metrics_the_product_exports(dashboards: dict[str, dict[str, Any]]) -> None:
    product = _product_metrics()
    histograms = {name for name, (kind, _) in product.items() if kind == "histogram"}
    for title, target in _prometheus_targets(dashboards):
        expr = target["expr"]
        used = _metric_names(expr)
        assert used, f"{title}: no metric found in {expr!r}"
        unknown = used - set(product) - {"up"}
        assert not unknown, f"{title}: libs.common.core.metrics does not define {sorted(unknown)}"
        for family in histograms:
            # A histogram is exposed only as _bucket, _sum and _count series, never under its own name.
            bare = re.search(rf"(?<![\w:]){re.escape(family)}(?![\w:])", expr)
            assert not bare, f"{title}: select {family}_bucket, _sum or _count, not {family}"


def test_queries_select_and_group_by_labels_the_metrics_carry(dashboards: dict[str, dict[str, Any]]) -> None:
    product = _product_metrics()
    for title, target in _prometheus_targets(dashboards):
        expr = target["expr"]
        for name, labels in _selectors(expr):
            missing = set(labels) - _labels_of(name, product)
            assert not missing, f"{title}: {name} has no label {sorted(missing)}"
        aggregations = list(_aggregations(expr))
        clauses = re.findall(r"\b(?:by|without)\s*\(", _masked(expr))
        assert len(clauses) == sum(kind is not None for kind, _, _ in aggregations), (
            f"{title}: a by/without clause outside an aggregation in {expr!r}"
        )
        for kind, grouped, body in aggregations:
            for name in _metric_names(body):
                missing = grouped - _labels_of(name, product)
                assert not missing, f"{title}: {kind} {sorted(missing)}, which {name} does not carry"


def test_legends_name_only_labels_the_query_keeps(dashboards: dict[str, dict[str, Any]]) -> None:
    product = _product_metrics()
    for title, target in _prometheus_targets(dashboards):
        expr = target["expr"]
        legend = set(re.findall(r"\{\{\s*([a-zA-Z_]\w*)\s*\}\}", target.get("legendFormat", "")))
        kept: set[str] = set().union(*(_labels_of(name, product) for name in _metric_names(expr)))
        for kind, labels, _ in _aggregations(expr):
            kept = kept - labels if kind == "without" else kept & labels
        assert legend <= kept, f"{title}: the legend names {sorted(legend - kept)}, which the query drops"


def test_rates_take_counters_and_counters_are_rated(dashboards: dict[str, dict[str, Any]]) -> None:
    product = _product_metrics()
    for title, target in _prometheus_targets(dashboards):
        expr = target["expr"]
        rated = set()
        outside = _masked(expr)
        for start, arguments, end in _calls(expr, RATE_FUNCTIONS):
            rated |= _metric_names(expr[arguments:end])
            outside = outside[:start] + " " * (end - start) + outside[end:]
        for name in rated:
            assert name != "up" and product[_family(name, product)][0] != "gauge", (
                f"{title}: rate()/increase() of the gauge {name}"
            )
        for name in _metric_names(outside) - {"up"}:
            assert product[_family(name, product)][0] == "gauge", (
                f"{title}: {name} is a counter or histogram series: take its rate() or increase()"
            )


def test_quantiles_aggregate_histogram_buckets_by_le(dashboards: dict[str, dict[str, Any]]) -> None:
    for title, target in _prometheus_targets(dashboards):
        expr = target["expr"]
        if "histogram_quantile" not in expr:
            continue
        assert "_bucket" in expr, f"{title}: histogram_quantile needs _bucket series"
        aggregations = list(_aggregations(expr))
        assert aggregations and all(
            "le" not in labels if kind == "without" else "le" in labels for kind, labels, _ in aggregations
        ), f"{title}: keep the `le` label in every aggregation under histogram_quantile"


def test_up_panels_watch_the_followups_scrape_jobs(
    dashboards: dict[str, dict[str, Any]], compose: dict[str, Any]
) -> None:
    prometheus = _yaml("prometheus.yml")
    jobs = {job["job_name"] for job in prometheus["scrape_configs"]}
    services = compose["services"]
    # The jobs scraping containers of the followups image (built from docker/Dockerfile).
    product_jobs = {job for job, host, _ in _targets(prometheus) if "build" in services.get(host, {})}
    assert product_jobs
    watched: set[str] = set()
    for title, target in _prometheus_targets(dashboards):
        for name, labels in _selectors(target["expr"]):
            if name == "up" and "job" in labels:
                matched = {job for job in jobs if re.fullmatch(labels["job"], job)}
                assert matched, f"{title}: up selects job {labels['job']!r}, which prometheus.yml lacks"
                watched |= matched
    assert product_jobs <= watched, f"no panel shows `up` of {sorted(product_jobs - watched)}"


# -- provisioning and compose ----------------------------------------------------------------------


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Container path -> (source, read-only) of every volume of a service (short syntax)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *mode = str(volume).split(":")
        found[target.rstrip("/")] = (source, "ro" in mode)
    return found


def _host_path(service: dict[str, Any], container_path: str) -> tuple[Path, bool] | None:
    """The file a container path shows, and whether it is read-only: None unless a bind mount holds it."""
    mounts = _mounts(service)
    holding = [t for t in mounts if container_path == t or container_path.startswith(t + "/")]
    if not holding:
        return None
    target = max(holding, key=len)  # the innermost mount wins
    source, read_only = mounts[target]
    if not source.startswith((".", "/")):
        return None  # a named volume: nothing from the repository
    return (DOCKER / source / container_path[len(target) :].lstrip("/")).resolve(), read_only


def test_grafana_is_pinned_published_and_open_to_viewers(
    grafana: dict[str, Any], compose: dict[str, Any]
) -> None:
    _, _, tag = str(grafana["image"]).partition(":")
    assert re.fullmatch(r"\d+\.\d+\.\d+", tag), f"pin the Grafana image to a release, not {tag or 'latest'}"
    assert "3000" in {str(p).rsplit(":", 1)[-1] for p in grafana.get("ports", [])}
    env = grafana.get("environment", {})
    assert isinstance(env, dict)
    assert str(env.get("GF_AUTH_ANONYMOUS_ENABLED")).lower() == "true"
    assert env.get("GF_AUTH_ANONYMOUS_ORG_ROLE") == "Viewer", "anonymous users must not edit"
    home = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        found = _host_path(grafana, home)
        assert found and found[0].is_file(), f"the home dashboard {home} is not a mounted dashboard file"


def test_grafana_mounts_its_provisioning(grafana: dict[str, Any]) -> None:
    for kind in ("datasources", "dashboards"):
        found = _host_path(grafana, f"{GRAFANA_PROVISIONING}/{kind}")
        assert found, f"mount docker/grafana/provisioning/{kind} at {GRAFANA_PROVISIONING}/{kind}"
        assert found[0] == (PROVISIONING / kind).resolve() and found[1], f"{kind}: mount it read-only"


def test_dashboard_providers_point_at_the_mounted_dashboards(
    grafana: dict[str, Any], providers: list[dict[str, Any]], dashboards: dict[str, dict[str, Any]]
) -> None:
    folders = set()
    for provider in providers:
        assert provider.get("type", "file") == "file", f"{provider.get('name')}: only file providers here"
        path = provider.get("options", {}).get("path")
        assert path, f"{provider.get('name')}: options.path is missing"
        found = _host_path(grafana, path)
        assert found, f"{provider.get('name')} reads {path}, which compose.yaml does not bind-mount"
        folder, read_only = found
        assert folder.is_dir() and read_only, f"{path}: mount a folder of the repository read-only"
        folders.add(folder)
    assert DASHBOARDS.resolve() in folders, "no dashboard provider loads docker/grafana/dashboards/"
    assert dashboards  # the files the providers load, parsed


def test_datasource_points_at_the_compose_prometheus(
    datasource: dict[str, Any], grafana: dict[str, Any], compose: dict[str, Any]
) -> None:
    match = re.fullmatch(r"http://([\w.-]+):(\d+)/?", str(datasource.get("url", "")))
    assert match, f"datasource url {datasource.get('url')!r} is not http://<service>:<port>"
    host, port = match.group(1), match.group(2)
    service = compose["services"].get(host)
    assert service and "prom/prometheus" in service.get("image", ""), f"{host} is not the Prometheus service"
    container_ports = {str(p).rsplit(":", 1)[-1] for p in service.get("ports", [])} or {"9090"}
    assert port in container_ports, f"Prometheus listens on {sorted(container_ports)}, not {port}"
    assert datasource.get("access", "proxy") == "proxy", "the browser cannot resolve compose service names"
    depends = grafana.get("depends_on", {})
    assert host in depends, f"grafana must depend on {host}"
