"""The Grafana dashboard and Prometheus alert rules of deploy/: every metric a panel or a rule
queries is one mcsync exports (``observe.metrics.Metrics``' registry, cache metrics included);
the dashboard loads in Grafana's dashboard model as the Grafana Foundation SDK defines it
(generated from Grafana's own schemas) with nothing lost; the rules are Prometheus rule groups
(``promtool check rules``) whose alerts fire on the series they should and only those
(``promtool test rules`` on deploy/prometheus/mcsync-alerts.test.yaml)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from mcsync.observe.metrics import Metrics
from tests.require import unavailable

DEPLOY = Path(__file__).parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "mcsync.json"
RULES = DEPLOY / "prometheus" / "mcsync-alerts.yaml"
RULE_TESTS = DEPLOY / "prometheus" / "mcsync-alerts.test.yaml"

# What the issue asks the dashboard to show, each by a metric that must be queried for it.
SHOWN = {
    "throughput": "mcsync_objects_total",
    "bytes sent": "mcsync_sent_bytes_total",
    "bytes received": "mcsync_received_bytes_total",
    "requests": "mcsync_requests_total",
    "throttling": "mcsync_throttled_requests_total",
    "run duration": "mcsync_run_duration_seconds_bucket",
    "last success": "mcsync_last_success_timestamp_seconds",
    "cache hits": "mcsync_cache_hits_total",
    "cache misses": "mcsync_cache_misses_total",
    "cache fill": "mcsync_cache_bytes_in_use",
    "cache limit": "mcsync_cache_limit_bytes",
}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan", "atan2"}


def exported() -> set[str]:
    """Every series name mcsync's metrics expose: a counter's ``_total``, a histogram's
    ``_bucket``, ``_sum`` and ``_count``, a gauge's own name."""
    names = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
        else:
            names.add(family.name)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions or
    aggregations (followed by "("), keywords, label names (inside {} or a by/on list),
    strings, ranges or Grafana's variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges, subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\w+", "", text)  # $__rate_interval, $instance
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)\s*(\()?", text):
        name, call = m.group(1), m.group(2)
        if call is None and name not in KEYWORDS:
            names.add(name)
    return names


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for p in doc["panels"]:
        found.append(p)
        found.extend(p.get("panels", []))  # a collapsed row's
    return found


def dashboard_queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel's targets and every query variable."""
    queries = [(p["title"], t["expr"]) for p in panels(doc) for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            queries.append((f"${var['name']}", inner.group(1) if inner else query))
    return queries


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_parser_finds_metric_names_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, store) (rate(mcsync_request_duration_seconds_'
            'bucket{instance=~"$instance", status!~"ok|x"}[$__rate_interval]))) / on(store) '
            'group_left sum(up offset 5m) > bool 0.5 * 3600 and time() - foo:bar')
    assert metric_names(expr) == {"mcsync_request_duration_seconds_bucket", "up", "foo:bar"}


def test_every_metric_the_dashboard_and_the_rules_query_is_one_mcsync_exports() -> None:
    names = exported()
    assert {"mcsync_requests_total", "mcsync_cache_hits_total",
            "mcsync_request_duration_seconds_bucket", "mcsync_cache_bytes_in_use"} <= names
    queries = dashboard_queries(dashboard()) + [(r["alert"], r["expr"]) for r in rules()]
    unknown = {(where, name) for where, expr in queries for name in metric_names(expr)
               if name not in names}
    assert unknown == set()
    queried = {name for _, expr in queries for name in metric_names(expr)}
    missing = {what: name for what, name in SHOWN.items() if name not in queried}
    assert missing == {}


def test_the_dashboard_loads_in_grafana_s_dashboard_model_with_nothing_lost() -> None:
    from grafana_foundation_sdk.cog import plugins, runtime
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import prometheus
    from grafana_foundation_sdk.models.dashboard import Dashboard, RowPanel

    plugins.register_default_plugins()
    doc = dashboard()
    model = Dashboard.from_json(doc)
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    lost = list(_lost(doc, again, ""))
    assert lost == []  # a field Grafana's model does not know, or a value it reads otherwise
    assert model.uid == "mcsync" and model.title

    for p in model.panels or []:
        if isinstance(p, RowPanel):
            continue
        assert runtime.panelcfg_config(p.type_val) is not None, p.type_val  # a panel Grafana ships
        assert p.targets and all(isinstance(t, prometheus.Dataquery) for t in p.targets)


def _lost(ours: Any, theirs: Any, path: str) -> Any:
    """Where ``theirs`` (the model's re-encoding) lacks or changed what ``ours`` says (it may
    add its defaults)."""
    if isinstance(ours, dict):
        for key, value in ours.items():
            if not isinstance(theirs, dict) or key not in theirs:
                yield f"{path}/{key}"
            else:
                yield from _lost(value, theirs[key], f"{path}/{key}")
    elif isinstance(ours, list):
        if not isinstance(theirs, list) or len(ours) != len(theirs):
            yield path
        else:
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                yield from _lost(a, b, f"{path}[{i}]")
    elif ours != theirs:
        yield f"{path}: {ours!r} became {theirs!r}"


def test_the_dashboard_s_panels_tile_the_grid() -> None:
    doc = dashboard()
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for p in panels(doc):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                 for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{p['title']} overlaps another panel"
        taken |= cells
    for p in panels(doc):  # every query through the dashboard's Prometheus
        for t in p.get("targets", []):
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_the_alert_rules_are_rule_groups_of_named_alerts() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert set(doc) == {"groups"}
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"} and group["name"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels",
                                 "annotations"}, rule
            assert re.fullmatch(r"MCSync[A-Z]\w+", rule["alert"])
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            assert re.fullmatch(r"\d+[smhd]", str(rule.get("for", "0m")))
            assert rule["labels"]["severity"] in ("critical", "warning", "info")
            assert rule["annotations"]["summary"]
    alerts = {rule["alert"] for rule in rules()}
    assert {"MCSyncNoRecentSuccess", "MCSyncRequestErrorRatio", "MCSyncThrottled"} <= alerts


def test_promtool_checks_the_rules_and_their_alerts_fire_as_tested() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        unavailable("promtool", "no promtool here (Debian: apt-get install prometheus)")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(rules())} rules found" in check.stdout
    tested = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], capture_output=True,
                            text=True, timeout=60, check=False, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert has a test that expects it to fire.
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {t["alertname"] for case in cases for t in case["alert_rule_test"]
             if t["exp_alerts"]}
    assert fired == {rule["alert"] for rule in rules()}
