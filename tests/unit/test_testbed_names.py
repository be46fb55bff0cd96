"""A second test bed's names never overlap the suite's default ones (pure: no namespaces made)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import testbed


def test_the_default_names_are_the_suites() -> None:
    bed = testbed._layout(2, Path("/tmp/x"))
    assert [h.name for h in bed.hosts] == ["lt-h1", "lt-h2"] and bed.hosts[1].address == "10.77.0.12"
    assert bed.names.bridge == testbed.BRIDGE and bed.names.bridge_address == testbed.BRIDGE_ADDRESS


def test_other_names_move_hosts_links_bridge_and_subnet() -> None:
    names = testbed.Names("fb-", "10.79.0")
    bed = testbed._layout(64, Path("/tmp/x"), names)
    host = bed.hosts[63]
    assert (host.name, host.namespace, host.veth, host.address) == ("fb-h64", "fb-h64", "fb-v64", "10.79.0.74")
    assert names.bridge == "fb-br0" and names.bridge_address == "10.79.0.1"
    assert not any(h.namespace.startswith(testbed.PREFIX) or h.veth.startswith(testbed.PREFIX) for h in bed.hosts)
    assert names.host_dir().fullmatch("fb-h12") and not names.host_dir().fullmatch("lt-h12")


def test_recorded_names_come_back_from_testbed_json(tmp_path: Path) -> None:
    (tmp_path / "testbed.json").write_text('{"hosts": ["fb-h1"], "prefix": "fb-", "subnet": "10.79.0"}')
    assert testbed._recorded_names(tmp_path) == testbed.Names("fb-", "10.79.0")
    assert testbed.load(tmp_path).hosts[0].address == "10.79.0.11"
    (tmp_path / "testbed.json").write_text('{"hosts": ["lt-h1"]}')  # written before names existed
    assert testbed._recorded_names(tmp_path) == testbed.Names()


@pytest.mark.parametrize("prefix,subnet", [("lt", "10.79.0"), ("toolong-", "10.79.0"), ("fb-", "192.168.0"),
                                           ("fb-", "10.79.300"), ("FB-", "10.79.0")])
def test_names_that_would_not_fit_are_refused(prefix: str, subnet: str) -> None:
    with pytest.raises(testbed.TestbedError):
        testbed.Names(prefix, subnet)
