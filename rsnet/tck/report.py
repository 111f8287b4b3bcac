"""Per-class summary of TCK results: a pytest plugin, and a runner that needs no pytest session.

A TCK test's status is in its name (``test_required_spec309_...``): ``required``, ``optional``,
``stochastic`` or ``untested``. A required test that was skipped did not pass: the summary
lists why, so that missing failed publishers or too small element counts stand out.

Enable the plugin for a whole pytest run in any of these ways:

- ``pytest -p rsnet.tck.report``, or ``addopts = "-p rsnet.tck.report"`` in ``pyproject.toml``;
- ``pytest_plugins = ["rsnet.tck.report"]`` in the top-level ``conftest.py``;
- ``from rsnet.tck.report import pytest_collection_modifyitems, pytest_terminal_summary`` in a
  ``conftest.py`` (it then covers the whole run, once that conftest is loaded).

Registered more than once, it still prints once. The terminal summary then has one block per
verification class::

    tests/tck/test_x.py::TestRange [PublisherVerification]
      required   22 passed, 0 failed, 0 skipped
      optional    8 passed, 0 failed, 0 skipped
      stochastic  1 passed, 0 failed, 0 skipped
      untested    0 passed, 0 failed, 7 skipped
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any

import pytest

from rsnet.tck.environment import Verification

STATUSES = ("required", "optional", "stochastic", "untested")
OUTCOMES = ("passed", "failed", "skipped")

_NAME = re.compile(r"^test_(required|optional|stochastic|untested)_(?:spec(\d)(\d\d)_)?")


def classify(test_name: str) -> tuple[str, str | None] | None:
    """``(status, rule)`` of a TCK test name, e.g. ``("required", "3.9")``; ``None`` if it is none.

    ``rule`` is ``None`` for tests without a rule id (``test_required_validate_...``).
    """
    match = _NAME.match(test_name)
    if match is None:
        return None
    status, section, number = match.groups()
    return status, None if section is None else f"{section}.{int(number)}"


def verification_kind(cls: type) -> str:
    """The name of the TCK verification class that ``cls`` is (or derives from)."""
    from rsnet.tck import (
        IdentityProcessorVerification,
        PublisherVerification,
        SubscriberBlackboxVerification,
        SubscriberWhiteboxVerification,
    )

    # The processor verification derives from two others, so it must be tested first.
    for kind in (
        IdentityProcessorVerification,
        PublisherVerification,
        SubscriberWhiteboxVerification,
        SubscriberBlackboxVerification,
    ):
        if issubclass(cls, kind):
            return kind.__name__
    return Verification.__name__


@dataclasses.dataclass
class ClassSummary:
    """The outcomes of one verification class's tests."""

    label: str
    kind: str
    counts: dict[str, collections.Counter[str]] = dataclasses.field(
        default_factory=lambda: {status: collections.Counter() for status in STATUSES}
    )
    required_not_passed: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    """``(test name, outcome, reason)`` of every required test that failed or was skipped."""

    def add(self, test_name: str, outcome: str, reason: str = "") -> None:
        classified = classify(test_name)
        if classified is None:
            return
        status = classified[0]
        self.counts[status][outcome] += 1
        if status == "required" and outcome != "passed":
            self.required_not_passed.append((test_name, outcome, reason))

    def lines(self) -> list[str]:
        result = [f"{self.label} [{self.kind}]"]
        for status in STATUSES:
            counts = self.counts[status]
            result.append(
                f"  {status:<10} {counts['passed']:3d} passed, {counts['failed']:3d} failed, {counts['skipped']:3d} skipped"
            )
        for name, outcome, reason in self.required_not_passed:
            result.append(f"  ! required {outcome}: {name}: {reason}")
        return result


def run_directly(cls: type[Verification]) -> dict[str, tuple[str, str]]:
    """Run every test method of a verification class without pytest's collection.

    Returns ``{test name: (outcome, reason)}`` with outcome ``"passed"``, ``"failed"`` or
    ``"skipped"``. Useful to assert on a whole class from inside a test.
    """
    results: dict[str, tuple[str, str]] = {}
    for name in sorted(name for name in dir(cls) if name.startswith("test_")):
        try:
            getattr(cls(), name)()
        except pytest.skip.Exception as skip:
            results[name] = ("skipped", skip.msg or "")
        except Exception as error:
            results[name] = ("failed", str(error))
        else:
            results[name] = ("passed", "")
    return results


def summarize_directly(cls: type[Verification]) -> ClassSummary:
    """:func:`run_directly`, summarized."""
    summary = ClassSummary(cls.__qualname__, verification_kind(cls))
    for name, (outcome, reason) in run_directly(cls).items():
        summary.add(name, outcome, reason)
    return summary


# -- the pytest plugin ---------------------------------------------------------------------------

_TCK_ITEMS = pytest.StashKey[dict[str, tuple[str, str, str]]]()
_PRINTED = pytest.StashKey[bool]()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Remember which collected tests belong to a TCK verification class."""
    tck_items = config.stash.setdefault(_TCK_ITEMS, {})
    for item in items:
        cls = getattr(item, "cls", None)
        if cls is not None and issubclass(cls, Verification) and item.parent is not None:
            tck_items[item.nodeid] = (
                item.parent.nodeid,
                verification_kind(cls),
                getattr(item, "originalname", item.name),
            )


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(getattr(longrepr, "reprcrash", None), "message", None)
    return str(crash if crash is not None else longrepr).splitlines()[0] if longrepr else ""


def summaries(terminalreporter: Any) -> list[ClassSummary]:
    """One :class:`ClassSummary` per verification class, from a finished pytest run."""
    tck_items = terminalreporter.config.stash.get(_TCK_ITEMS, {})
    outcome_of: dict[str, tuple[str, str]] = {}
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for key in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(key, []):
            nodeid = getattr(report, "nodeid", None)
            if nodeid is None or nodeid not in tck_items:
                continue
            outcome = "failed" if key == "error" else report.outcome
            if outcome not in rank or (report.when != "call" and outcome == "passed"):
                continue
            if nodeid not in outcome_of or rank[outcome] > rank[outcome_of[nodeid][0]]:
                outcome_of[nodeid] = (outcome, _reason(report) if outcome != "passed" else "")
    by_class: dict[str, ClassSummary] = {}
    for nodeid, (label, kind, name) in tck_items.items():
        if nodeid in outcome_of:
            summary = by_class.setdefault(label, ClassSummary(label, kind))
            summary.add(name, *outcome_of[nodeid])
    return list(by_class.values())


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print the per-class TCK summary (once, however often the plugin is registered)."""
    if config.stash.get(_PRINTED, False):
        return
    config.stash[_PRINTED] = True
    found = summaries(terminalreporter)
    if not found:
        return
    terminalreporter.write_sep("=", "rsnet.tck summary")
    for summary in found:
        for line in summary.lines():
            terminalreporter.write_line(line)
