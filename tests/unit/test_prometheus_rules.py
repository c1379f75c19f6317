"""The shipped alerting rules hold together: every alert has its ``for``, severity, summary,
description and a runbook section in docs/alerts.md, reads only documented metrics, and is
tested to fire by the promtool unit tests. (promtool itself runs them in
``tests/integration/test_prometheus.py``.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "dnslb.rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "dnslb.rules.test.yml"
RUNBOOKS = ROOT / "docs" / "alerts.md"
METRICS_DOC = ROOT / "docs" / "api.md"

SEVERITIES = {"critical", "warning", "info"}


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings (enough for headings of letters, digits and spaces)."""
    return {
        re.sub(r"[^a-z0-9 -]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    }


@pytest.mark.parametrize("alert", alerts(), ids=lambda alert: alert["alert"])
def test_every_alert_says_how_long_how_bad_what_and_where_its_runbook_is(
    alert: dict[str, Any],
) -> None:
    assert re.fullmatch(r"\d+[smh]", str(alert.get("for", ""))), "a for: duration"
    assert alert["labels"]["severity"] in SEVERITIES
    annotations = alert["annotations"]
    assert annotations["summary"] and annotations["description"]
    url = annotations["runbook_url"]
    assert url == f"docs/alerts.md#{alert['alert'].lower()}"
    assert url.split("#")[1] in anchors(RUNBOOKS.read_text())


def test_alert_names_are_unique_and_every_runbook_section_has_its_alert() -> None:
    names = [alert["alert"] for alert in alerts()]
    assert len(names) == len(set(names))
    sections = re.findall(r"^## (Dnslb\w+)$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    assert sections == names  # one section per alert, in the rules' order


def test_rules_read_only_documented_metrics() -> None:
    documented = set(re.findall(r"`(dnslb_[a-z_]+)", METRICS_DOC.read_text()))
    for rule in rules():
        # Metric names, not recorded series (level:metric:operations).
        used = set(re.findall(r"(?<![:\w])(dnslb_[a-z_]+)", rule["expr"]))
        assert used <= documented, f"{rule.get('alert') or rule['record']}: {used - documented}"


def test_every_alert_is_tested_to_fire() -> None:
    document = yaml.safe_load(RULE_TESTS.read_text())
    assert document["rule_files"] == [RULES.name]
    fired = {
        case["alertname"]
        for test in document["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == {alert["alert"] for alert in alerts()}
