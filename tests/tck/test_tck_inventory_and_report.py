"""The TCK has a counterpart of every test of the official TCK 1.0.4; settings; the report plugin."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rsnet.tck
from rsnet.tck import (
    IdentityProcessorVerification,
    PublisherVerification,
    SubscriberBlackboxVerification,
    SubscriberWhiteboxVerification,
    TestEnvironment,
)
from rsnet.tck.report import classify, verification_kind

# (status, rule) of every test, from the rule inventory of the Java TCK (None: no rule id).
PUBLISHER = {
    "required": [None, None, None, None, "1.1", "1.2", "1.5", "1.7", "1.9", "1.9", "1.9",
                 "3.2", "3.3", "3.6", "3.7", "3.9", "3.9", "3.12", "3.13", "3.17", "3.17", "3.17"],
    "optional": ["1.4", "1.5", "1.11", "1.11", "1.11", "1.11", "1.11", "3.9"],
    "stochastic": ["1.3"],
    "untested": ["1.6", "1.7", "1.8", "1.9", "1.10", "3.4", "3.5"],
}  # fmt: skip
WHITEBOX = {
    "required": [None, "2.1", "2.3", "2.3", "2.5", "2.8", "2.9", "2.9", "2.10", "2.10",
                 "2.13", "2.13", "2.13", "3.8"],
    "untested": ["2.2", "2.4", "2.6", "2.7", "2.11", "2.12", "2.13", "3.1", "3.10", "3.11",
                 "3.14", "3.15", "3.16"],
}  # fmt: skip
BLACKBOX = {
    "required": ["2.1", "2.3", "2.3", "2.5", "2.9", "2.9", "2.10", "2.10", "2.13", "2.13", "2.13"],
    "untested": ["2.2", "2.4", "2.6", "2.7", "2.8", "2.11", "2.12", "2.13", "3.1", "3.8", "3.10",
                 "3.11", "3.14", "3.15", "3.16"],
}  # fmt: skip
PROCESSOR_OWN = {"required": ["1.4", None, None]}


def _inventory(cls: type) -> dict[str, list[str | None]]:
    found: dict[str, list[str | None]] = collections.defaultdict(list)
    for name in dir(cls):
        if name.startswith("test_"):
            classified = classify(name)
            assert classified is not None, f"{name} has no status prefix"
            found[classified[0]].append(classified[1])
    return found


def _expected(*parts: dict[str, list[str | None]]) -> dict[str, list[str | None]]:
    merged: dict[str, list[str | None]] = collections.defaultdict(list)
    for part in parts:
        for status, rules in part.items():
            merged[status].extend(rules)
    return merged


def _key(rule: str | None) -> tuple[int, ...]:
    return () if rule is None else tuple(int(p) for p in rule.split("."))


@pytest.mark.parametrize(
    ("cls", "expected", "total"),
    [
        (PublisherVerification, _expected(PUBLISHER), 38),
        (SubscriberWhiteboxVerification, _expected(WHITEBOX), 27),
        (SubscriberBlackboxVerification, _expected(BLACKBOX), 26),
        (IdentityProcessorVerification, _expected(PUBLISHER, WHITEBOX, PROCESSOR_OWN), 68),
    ],
)
def test_every_test_of_the_official_tck_has_a_counterpart(
    cls: type, expected: dict[str, list[str | None]], total: int
) -> None:
    found = _inventory(cls)
    assert sum(len(rules) for rules in found.values()) == total
    for status in ("required", "optional", "stochastic", "untested"):
        assert sorted(found.get(status, []), key=_key) == sorted(expected.get(status, []), key=_key), status


@pytest.mark.parametrize(
    ("name", "classified"),
    [
        ("test_required_spec309_request_zero_must_signal_illegal_argument", ("required", "3.9")),
        ("test_optional_spec111_may_support_multi_subscribe", ("optional", "1.11")),
        ("test_untested_spec213_blackbox_failing_on_signal_invocation", ("untested", "2.13")),
        ("test_required_validate_max_elements_from_publisher", ("required", None)),
        ("test_reference_publishers_pass", None),
    ],
)
def test_classify(name: str, classified: tuple[str, str | None] | None) -> None:
    assert classify(name) == classified


def test_verification_kind() -> None:
    class Processor(IdentityProcessorVerification[int]):
        pass

    assert verification_kind(Processor) == "IdentityProcessorVerification"
    assert verification_kind(SubscriberBlackboxVerification) == "SubscriberBlackboxVerification"


def test_settings_come_from_arguments_unless_overridden_by_environment_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (
        "RSNET_TCK_TIMEOUT_MS",
        "RSNET_TCK_NO_SIGNALS_TIMEOUT_MS",
        "RSNET_TCK_GC_TIMEOUT_MS",
    ):
        monkeypatch.delenv(name, raising=False)
    env = TestEnvironment.from_environ(timeout_ms=500)
    assert (env.timeout_ms, env.no_signals_timeout_ms, env.gc_timeout_ms) == (500, 500, 300)

    monkeypatch.setenv("RSNET_TCK_TIMEOUT_MS", "1000")
    monkeypatch.setenv("RSNET_TCK_GC_TIMEOUT_MS", "50")
    env = TestEnvironment.from_environ(timeout_ms=500, no_signals_timeout_ms=20)
    assert (env.timeout_ms, env.no_signals_timeout_ms, env.gc_timeout_ms) == (1000, 20, 50)
    assert env.timeout_s == 1.0

    monkeypatch.setenv("RSNET_TCK_NO_SIGNALS_TIMEOUT_MS", "200")
    assert TestEnvironment.from_environ().no_signals_timeout_ms == 200

    monkeypatch.setenv("RSNET_TCK_TIMEOUT_MS", "soon")
    with pytest.raises(ValueError, match="RSNET_TCK_TIMEOUT_MS='soon' is not a number of milliseconds"):
        TestEnvironment.from_environ()


def test_a_verification_uses_its_class_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RSNET_TCK_TIMEOUT_MS", raising=False)
    monkeypatch.delenv("RSNET_TCK_NO_SIGNALS_TIMEOUT_MS", raising=False)

    class Slow(SubscriberBlackboxVerification[int]):
        timeout_ms = 2000
        no_signals_timeout_ms = 250

    verification = Slow()

    async def body() -> None:
        assert (verification.env.timeout_ms, verification.env.no_signals_timeout_ms) == (2000, 250)

    verification.run_test(body)


def test_report_plugin_prints_a_summary_per_class(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent("""
            from rsnet.streams.interfaces import Publisher, Subscription
            from rsnet.tck import PublisherVerification


            class Once(Subscription):
                def __init__(self, subscriber):
                    self.subscriber = subscriber

                def request(self, n):
                    subscriber, self.subscriber = self.subscriber, None
                    if subscriber is not None:
                        subscriber.on_next(1)
                        subscriber.on_complete()

                def cancel(self):
                    self.subscriber = None


            class Single(Publisher):
                def subscribe(self, subscriber):
                    if subscriber is None:
                        raise TypeError
                    subscriber.on_subscribe(Once(subscriber))


            class TestSingle(PublisherVerification):
                max_elements_from_publisher = 1

                def create_publisher(self, elements):
                    return Single()

                def create_failed_publisher(self):
                    return None
            """)
    )
    # Registered twice (a conftest import and -p): printed once all the same.
    (tmp_path / "conftest.py").write_text(
        "from rsnet.tck.report import pytest_collection_modifyitems, pytest_terminal_summary\n"
    )
    root = Path(rsnet.tck.__file__).resolve().parents[2]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "rsnet.tck.report",
            "-p",
            "no:cacheprovider",
            "-q",
            "test_sample.py",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout
    assert out.count("rsnet.tck summary") == 1, out
    assert "test_sample.py::TestSingle [PublisherVerification]" in out
    # Seven required tests manage with 1 element; the rest are skipped, and each is listed.
    assert "  required     7 passed,   0 failed,  15 skipped" in out, out
    assert (
        "! required skipped: test_required_spec101_subscription_request_must_result_in_the_correct_number_of_produced_elements: Unable to run this test: it needs 5 elements, but max_elements_from_publisher is 1"
        in out
    )
    assert "! required skipped: test_required_spec109_may_reject" in out
    assert "no failed publisher was provided" in out
