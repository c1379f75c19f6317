"""Settings built in code: dnslb.config.checked and problems_of, the builder's rules applied."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping

import pytest

from dnslb.config import Secret, checked, parse_config, problems_of, setting
from dnslb.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Port:
    """A port and its weight."""

    number: int = setting(help="the port", min=1, max=65535)
    weight: float = setting(1.0, help="its weight", min=0.0)


@dataclasses.dataclass(frozen=True)
class Service:
    """A service."""

    name: str = setting(help="its name")
    low: int = setting(1, help="low")
    high: int = setting(2, help="high")
    ports: tuple[Port, ...] = setting(default_factory=tuple, help="its ports")
    by_name: Mapping[str, Port] = setting(default_factory=dict, help="ports by name")
    main: Port | None = setting(None, help="the main port")
    token: Secret | None = setting(None, help="a secret")

    def config_problems(self) -> Iterator[str]:
        if self.low > self.high:
            yield "low: must not exceed high"


def test_a_valid_instance_is_returned_as_it_is() -> None:
    service = Service("web", ports=(Port(80),), main=Port(443))
    assert checked(service) is service
    assert problems_of(service) == []


def test_every_problem_is_listed_with_its_path() -> None:
    service = Service(
        "web",
        low=3,
        ports=(Port(80), Port(0, weight=-1.0)),
        by_name={"admin": Port(70000)},
        main=Port(1, weight=math.nan),
    )
    assert problems_of(service) == [
        "ports[1].number: must be at least 1, not 0",
        "ports[1].weight: must be at least 0.0, not -1.0",
        "by_name.admin.number: must be at most 65535, not 70000",
        "main.weight: must be a number, not nan",
        "low: must not exceed high",  # the rules run too, so that everything is listed at once
    ]
    with pytest.raises(ConfigError) as caught:
        checked(service, "service web")
    assert caught.value.what == "service web"
    assert len(caught.value.problems) == 5
    with pytest.raises(ConfigError, match=r"^Service: "):
        checked(Service("web", low=3))


def test_the_words_are_the_builders() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("name: web\nports: [{number: 0}]\n", Service)
    from_file = caught.value.problems[0].split(": ", 1)[1]  # without "<config>, line 2"
    assert [from_file] == problems_of(Service("web", ports=(Port(0),)))
