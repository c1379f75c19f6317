"""The manager's side of topology: locations and client networks from its config into the plan,
each server's location in its view, and each location's load in the metrics."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from api.metrics import metrics_registry, render
from dnslb.control import LocationLoad, location_loads
from dnslb.errors import ConfigError
from dnslb.plan import GeoIp, Network
from manager.config import load_manager_config
from manager.control import Control
from tests.unit.test_manager import CONFIG, Lab, tokens  # noqa: F401 (an autouse fixture)

TOPOLOGY = CONFIG.replace(
    """      - {id: s1, address: 10.0.0.1}
      - {id: s2, address: 10.0.0.2}
      - {id: s3, address: 10.0.0.3, token: env:DNSLB_TEST_S3_TOKEN}
""",
    """      - {id: s1, address: 10.0.0.1, location: eu}
      - {id: s2, address: 10.0.0.2, location: eu}
      - {id: s3, address: 10.0.0.3, token: env:DNSLB_TEST_S3_TOKEN, location: us}
    networks:
      - {network: 192.0.2.0/24, location: eu}
      - {network: "2001:DB8::/32", location: us}
    geoip:
      database: /var/lib/geoip/City.mmdb
      locations: {FR: eu, US-CA: us}
""",
)


def test_the_plan_carries_locations_and_networks_and_metrics_show_each_location(
    tmp_path: Path,
) -> None:
    lab = Lab(tmp_path, TOPOLOGY)
    lab.report("s1", 10)
    lab.report("s2", 30)
    lab.report("s3", 50)
    plan = lab.step()
    assert plan is not None
    pool = plan.pools[0]
    assert {m.id: m.location for m in pool.members} == {"s1": "eu", "s2": "eu", "s3": "us"}
    assert pool.networks == (
        Network("192.0.2.0/24", "eu"),
        Network("2001:db8::/32", "us"),
    )
    assert pool.geoip == GeoIp("/var/lib/geoip/City.mmdb", (("FR", "eu"), ("US-CA", "us")))
    control = Control(lab.manager)
    assert {s.id: s.location for s in control.servers()} == {"s1": "eu", "s2": "eu", "s3": "us"}
    assert location_loads(control.servers()) == [
        LocationLoad("www", "eu", servers=2, reporting=2, utilization=pytest.approx(0.2)),
        LocationLoad("www", "us", servers=1, reporting=1, utilization=pytest.approx(0.5)),
    ]
    text = render(metrics_registry(control)).decode()
    assert 'dnslb_location_utilization{location="eu",pool="www"} 0.2' in text
    assert 'dnslb_location_utilization{location="us",pool="www"} 0.5' in text


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        pytest.param("192.0.2.0/24", "192.0.2.1/24", "host bits", id="host-bits"),
        pytest.param("location: eu}", "location: Europe}", "a-z", id="bad-location"),
        pytest.param("/var/lib/geoip/City.mmdb", "x.mmdb", "absolute path", id="relative"),
        pytest.param("US-CA: us", "california: us", "not a country", id="bad-code"),
    ],
)
def test_topology_mistakes_are_config_errors(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    path = tmp_path / "manager.yaml"
    path.write_text(TOPOLOGY.replace(old, new, 1))
    with pytest.raises(ConfigError, match=message):
        load_manager_config(path)


def test_the_docs_manager_example_loads(tmp_path: Path) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "topology.md"
    block = re.search(r"```yaml\n(.*?)```", docs.read_text(), re.S)
    assert block is not None, "docs/topology.md lost its manager example"
    head = CONFIG[: CONFIG.index("pools:")]
    path = tmp_path / "manager.yaml"
    path.write_text(head + block.group(1))
    pool = load_manager_config(path).config.pools[0]
    assert pool.location == "eu"
    assert pool.members[0].location == "us"
    assert pool.geoip is not None and dict(pool.geoip.locations) == {"FR": "eu", "US": "us"}
