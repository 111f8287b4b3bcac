"""rsnet topics create|alter|delete|purge, through the broker's $admin, guarded by an admin grant;
settings given at creation are stored with the topic and still apply after a restart."""

from __future__ import annotations

import json
import os
import subprocess
import time

from rsnet.cli import main
from rsnet.cli.topics import retention, show_duration, show_size

from .support import RSNET, Daemon, auth_config, env, one_line, rsnet


def test_create_purge_and_delete_a_durable_topic(tmp_path):
    data = tmp_path / "data"
    with Daemon("broker", "--tcp", "127.0.0.1:0", "--data-dir", str(data)) as broker:
        created = rsnet("topics", "create", broker.url, "jobs.eu")
        assert (created.returncode, created.stdout.splitlines()[0]) == (0, "jobs.eu: created"), created.stderr
        assert rsnet("topics", "create", broker.url, "jobs.eu").stdout.startswith("jobs.eu: exists already\n")
        assert rsnet("pub", broker.url, "jobs.eu", stdin="1\n2\n3\n").returncode == 0
        follower = subprocess.Popen(
            [RSNET, "sub", broker.url, "jobs.eu", "--from", "earliest"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        assert [follower.stdout.readline() for _ in range(3)][-1].startswith('{"topic": "jobs.eu", "offset": 2')

        unconfirmed = rsnet("topics", "purge", broker.url, "jobs.eu")
        assert unconfirmed.returncode == 2 and "add --yes" in unconfirmed.stderr
        purged = rsnet("topics", "purge", broker.url, "jobs.eu", "--yes")
        assert (purged.returncode, purged.stdout) == (
            0,
            "jobs.eu: purged (3 records removed; the next record is offset 3)\n",
        ), purged.stderr
        empty = rsnet("sub", broker.url, "jobs.eu", "--from", "earliest", "--until-end")
        assert (empty.returncode, empty.stdout) == (0, "")
        gone = rsnet("sub", broker.url, "jobs.eu", "--from", "0", "--until-end")
        assert gone.returncode == 1 and "OFFSET_TRIMMED" in gone.stderr, gone.stderr

        # The offsets go on, never given to other data; the live reader carries on.
        assert rsnet("pub", broker.url, "jobs.eu", stdin="4\n").returncode == 0
        assert json.loads(follower.stdout.readline())["offset"] == 3
        deleted = rsnet("topics", "delete", broker.url, "jobs.eu", "--yes")
        assert (deleted.returncode, deleted.stdout) == (
            0,
            "jobs.eu: deleted (1 record removed; a topic created under its name starts at offset 4)\n",
        )
        # The live reader is told, with the code, and ends with 1.
        assert follower.wait(timeout=10) == 1
        assert one_line(follower.stderr.read()) == "rsnet sub: UNKNOWN_PUBLISHER: topic 'jobs.eu' was deleted"
        follower.stdout.close()
        follower.stderr.close()
        assert not (data / "jobs.eu").exists()
        assert "jobs.eu" not in rsnet("topics", broker.url).stdout
        again = rsnet("topics", "delete", broker.url, "jobs.eu", "--yes")
        assert (
            again.returncode == 1
            and one_line(again.stderr) == "rsnet topics: UNKNOWN_PUBLISHER: no topic named 'jobs.eu'"
        )

        # Created again, it goes on from there: offset 0 was another record.
        assert rsnet("pub", broker.url, "jobs.eu", stdin="5\n").returncode == 0
        reread = rsnet("sub", broker.url, "jobs.eu", "--from", "earliest", "--until-end")
        assert [json.loads(line)["offset"] for line in reread.stdout.splitlines()] == [4], reread.stderr
        old = rsnet("sub", broker.url, "jobs.eu", "--from", "0", "--until-end")
        assert old.returncode == 1 and "OFFSET_TRIMMED" in old.stderr, old.stderr

        # A topic that never held a record: the next one goes to offset 0 (it said "None").
        assert rsnet("topics", "create", broker.url, "jobs.empty").returncode == 0
        empty_deleted = rsnet("topics", "delete", broker.url, "jobs.empty", "--yes")
        assert (empty_deleted.returncode, empty_deleted.stdout) == (
            0,
            "jobs.empty: deleted (0 records removed; a topic created under its name starts at offset 0)\n",
        ), empty_deleted.stderr


def test_only_an_admin_grant_covering_the_topic_allows_it(tmp_path):
    config = tmp_path / "rsnet.toml"
    tokens = auth_config(
        config,
        ops={"publish": [">"], "subscribe": [">"], "admin": ["ops.>"]},
        ingest={"publish": [">"], "subscribe": [">"]},
    )
    admin, producer = tokens["ops"], tokens["ingest"]
    with Daemon("broker", "--config", str(config), "--tcp", "127.0.0.1:0") as broker:
        denied = rsnet("topics", "create", broker.url, "ops.jobs", env=env(RSNET_TOKEN=producer))
        assert denied.returncode == 1
        assert one_line(denied.stderr) == "rsnet topics: UNAUTHORIZED: not allowed to admin 'ops.jobs'"
        outside = rsnet("topics", "create", broker.url, "sensors.x", env=env(RSNET_TOKEN=admin))
        assert outside.returncode == 1 and "UNAUTHORIZED" in outside.stderr
        allowed = rsnet("topics", "create", broker.url, "ops.jobs", "--json", env=env(RSNET_TOKEN=admin))
        assert allowed.returncode == 0, allowed.stderr
        assert '"created": true' in allowed.stdout
        # Settings too: only with the grant.
        for action in ("create", "alter"):
            refused = rsnet("topics", action, broker.url, "ops.jobs", "--policy", "drop", env=env(RSNET_TOKEN=producer))
            assert refused.returncode == 1
            assert one_line(refused.stderr) == "rsnet topics: UNAUTHORIZED: not allowed to admin 'ops.jobs'"
        assert listed(broker.url, env=env(RSNET_TOKEN=admin))["ops.jobs"]["policy"] == "backpressure"
        altered = rsnet("topics", "alter", broker.url, "ops.jobs", "--policy", "drop", env=env(RSNET_TOKEN=admin))
        assert altered.returncode == 0, altered.stderr
        assert listed(broker.url, env=env(RSNET_TOKEN=admin))["ops.jobs"]["policy"] == "drop"


def test_options_may_come_before_the_topic_and_a_misplaced_action_is_named(tmp_path):
    with Daemon("broker", "--tcp", "127.0.0.1:0") as broker:
        created = rsnet("topics", "create", "--max-lag", "100", "-s", broker.url, "bp.t", "--policy", "drop")
        assert (created.returncode, created.stdout.splitlines()[0]) == (0, "bp.t: created"), created.stderr
        assert listed(broker.url)["bp.t"]["settings"]["slow_subscriber"] == {"policy": "drop", "max_lag": 100}
        published = rsnet("pub", "--producer", "p", broker.url, "bp.t", stdin="1\n")
        assert published.returncode == 0, published.stderr
        backwards = rsnet("topics", broker.url, "purge", "bp.t", "--yes")
        assert backwards.returncode == 2
        assert "the action comes first: rsnet topics purge [URL] TOPIC" in backwards.stderr
        unknown = rsnet("topics", "frobnicate", "x")
        assert unknown.returncode == 2 and "unknown action 'frobnicate': create, alter" in unknown.stderr
        stray = rsnet("topics", "create", broker.url, "x", "--max-lag", "5", "--nope")
        assert stray.returncode == 2 and "unrecognized arguments: --nope" in stray.stderr


def listed(url: str, **kwargs) -> dict[str, dict]:
    shown = rsnet("topics", url, "--json", **kwargs)
    assert shown.returncode == 0, shown.stderr
    return {entry["topic"]: entry for entry in map(json.loads, shown.stdout.splitlines())}


def test_settings_given_at_creation_apply_after_a_restart(tmp_path):
    data = tmp_path / "data"
    with Daemon("broker", "--tcp", "127.0.0.1:0", "--data-dir", str(data)) as broker:
        created = rsnet(
            "topics", "create", broker.url, "recent", "--storage", "memory", "--retention", "records=3,age=none"
        )
        assert created.returncode == 0, created.stderr
        assert created.stdout == (
            "recent: created\n"
            "  settings: storage memory, max_records 3, max_age none (set on the topic); "
            "policy backpressure, max_lag 10000, max_bytes 1 GiB (built-in)\n"
        )
        slow = rsnet("topics", "create", broker.url, "slow", "--policy", "drop", "--max-lag", "50")
        assert slow.returncode == 0, slow.stderr

    with Daemon("broker", "--tcp", "127.0.0.1:0", "--data-dir", str(data)) as broker:
        topics = listed(broker.url)
        assert topics["recent"]["settings"]["retention"] == {"max_records": 3, "max_bytes": 1 << 30, "max_age_s": None}
        assert topics["recent"]["settings_from"]["retention.max_records"] == "topic"
        assert topics["slow"]["policy"] == "drop"
        assert topics["slow"]["settings"]["slow_subscriber"] == {"policy": "drop", "max_lag": 50}
        table = rsnet("topics", broker.url).stdout
        assert "  settings: policy drop, max_lag 50 (set on the topic); storage durable, " in table

        assert rsnet("pub", broker.url, "recent", stdin="".join(f"{n}\n" for n in range(10))).returncode == 0
        deadline = time.monotonic() + 20  # the broker's retention sweep runs every second
        while listed(broker.url)["recent"]["first_offset"] != 7:
            assert time.monotonic() < deadline, "retention never trimmed the topic to its last 3 records"
            time.sleep(0.2)
        kept = rsnet("sub", broker.url, "recent", "--from", "earliest", "--until-end", "--format", "value")
        assert kept.stdout == "7\n8\n9\n"

        changed = rsnet("topics", "alter", broker.url, "slow", "--reset", "policy", "--max-lag", "20")
        assert changed.returncode == 0, changed.stderr
        assert changed.stdout.splitlines()[0] == "slow: altered (policy, max_lag)"
        assert listed(broker.url)["slow"]["settings_from"]["slow_subscriber.policy"] == "built-in"


def run_here(capsys, *args: str) -> tuple[int, str]:
    """``rsnet *args`` in this process (no interpreter to start: these only parse, or ask the
    broker one question): its exit code and what it printed on stderr."""
    try:
        code = main(list(args))
    except SystemExit as exit:  # argparse's usage errors
        code = exit.code
    return code, capsys.readouterr().err


def test_settings_errors_are_one_line_naming_the_code(broker, capsys, monkeypatch):
    for name in [name for name in os.environ if name.startswith("RSNET_")]:
        monkeypatch.delenv(name)
    assert run_here(capsys, "topics", "create", broker.url, "admin.set", "--policy", "drop")[0] == 0
    code, err = run_here(capsys, "topics", "create", broker.url, "admin.set", "--policy", "disconnect")
    assert (code, one_line(err)) == (
        1,
        "rsnet topics: REJECTED: topic 'admin.set' exists with other settings (slow_subscriber.policy is 'drop', "
        "not 'disconnect'): create does not change a topic, alter does",
    )
    code, err = run_here(capsys, "topics", "create", broker.url, "admin.disk", "--storage", "durable")
    assert (code, one_line(err)) == (
        1,
        "rsnet topics: REJECTED: settings.storage: 'durable' needs a broker with a data_dir "
        "(this one keeps every topic in memory)",
    )
    for args, message in [
        (["--retention", "records=0"], "argument --retention: records: must be above 0 (none: no limit), got '0'"),
        (["--retention", "size=5"], "expected records=N, bytes=SIZE or age=DURATION, got 'size=5'"),
        (["--retention", "age=soon"], "age: expected a duration such as 90s, 12h or 7d, got 'soon'"),
        (["--retention", "bytes=12QB"], "bytes: expected a size such as 1048576, 500MB or 1GiB, got '12QB'"),
        (["--policy", "block"], "invalid choice: 'block' (choose from 'backpressure', 'drop', 'disconnect')"),
        (["--max-lag", "0"], "argument --max-lag: must be at least 1, got 0"),
        (["--reset", "policy"], "--reset is for alter"),
    ]:
        code, err = run_here(capsys, "topics", "create", broker.url, "admin.bad", *args)
        assert code == 2 and message in err, err
    code, err = run_here(capsys, "topics", broker.url, "--policy", "drop")
    assert code == 2 and "settings are for create and alter" in err
    code, err = run_here(capsys, "topics", "alter", broker.url, "admin.set")
    assert code == 2 and "alter needs a setting to change" in err
    code, err = run_here(capsys, "topics", "purge", broker.url, "admin.set", "--yes", "--max-lag", "5")
    assert code == 2 and "purge takes no settings" in err
    assert "admin.bad" not in listed(broker.url)


def test_sizes_and_durations_as_users_write_them():
    assert retention("records=1000,bytes=500MB,age=7d") == {
        "max_records": 1000,
        "max_bytes": 500_000_000,
        "max_age_s": 7 * 86400.0,
    }
    assert retention("bytes=1GiB,age=1h30m") == {"max_bytes": 1 << 30, "max_age_s": 5400.0}
    assert retention("bytes=4096,age=90") == {"max_bytes": 4096, "max_age_s": 90.0}
    assert retention("records=none,bytes=NONE") == {"max_records": None, "max_bytes": None}
    assert [show_size(n) for n in (1 << 30, 3 << 20, 1000)] == ["1 GiB", "3 MiB", "1000 B"]
    assert [show_duration(s) for s in (604800.0, 5400.0, 90.0, 0.5)] == ["7d", "1h30m", "1m30s", "0.5s"]


def test_topics_lists_a_topic_whose_log_cannot_be_opened_as_unavailable_with_why(tmp_path):
    data = tmp_path / "data"
    broker = Daemon("broker", "--data-dir", str(data), "--tcp", "127.0.0.1:0")
    try:
        assert rsnet("pub", broker.url, "jobs.eu", stdin="1\n2\n").returncode == 0
    finally:
        broker.stop()
    (segment,) = (data / "jobs.eu").glob("*.log")
    damaged = bytearray(segment.read_bytes())
    damaged[11] ^= 0x40  # its format version: 65, a newer rsnet's or damaged
    segment.write_bytes(damaged)
    broker = Daemon("broker", "--data-dir", str(data), "--tcp", "127.0.0.1:0")
    try:
        listed = rsnet("topics", broker.url)
        assert listed.returncode == 0, listed.stderr
        assert "  unavailable: cannot be opened: " in listed.stdout and "segment format version 65" in listed.stdout
    finally:
        broker.stop()
