"""pytest imports test modules by their basename (rootdir-relative, no packages under tests/), so
two test files of one name in different tiers cannot both be collected in one run: the second
stops the whole session at collection. Caught here, in the fast tier, instead of in CI."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_name_of_its_own() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    repeated = sorted(name for name, count in names.items() if count > 1)
    assert not repeated, f"test modules sharing a name across tiers: {repeated}"
