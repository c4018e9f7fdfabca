"""Ports handed out from AML_PORT_RANGE: the tier that `dev.py test` runs beside the others
takes its ports outside the kernel's ephemeral range, so the two runs cannot collide."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from aml_devtools.processes import PORT_RANGE_ENV, ProcessError, free_port


def test_ports_come_from_the_range_and_skip_a_taken_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
            taken.bind(("127.0.0.1", 0))
            port = taken.getsockname()[1]
            if port < 65535 and _bindable(port + 1):
                monkeypatch.setenv(PORT_RANGE_ENV, f"{port}-{port + 1}")
                # The first port is held, so only the second can be handed out.
                assert {free_port() for _ in range(20)} == {port + 1}
                return
    pytest.fail("no pair of adjacent ports with the second free")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_without_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    kernel_range = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    low, high = (int(part) for part in kernel_range)
    assert low <= free_port() <= high


@pytest.mark.parametrize("spec", ["1-2", "30000", "x-y", "40000-30000", "1000-2000", "60000-70000"])
def test_a_malformed_range_is_refused_with_its_value(
    monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, spec)
    with pytest.raises(ProcessError, match=PORT_RANGE_ENV):
        free_port()


def test_a_full_range_fails_instead_of_looping(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        monkeypatch.setenv(PORT_RANGE_ENV, f"{port}-{port}")
        with pytest.raises(ProcessError, match="free port"):
            free_port()
