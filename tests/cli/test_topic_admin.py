"""rsnet topics create|delete|purge, through the broker's $admin, guarded by an admin grant."""

from __future__ import annotations

import subprocess

from rsnet.broker.auth import generate_token, hash_token

from .support import RSNET, Daemon, env, one_line, rsnet


def test_create_purge_and_delete_a_durable_topic(tmp_path):
    data = tmp_path / "data"
    with Daemon("broker", "--tcp", "127.0.0.1:0", "--data-dir", str(data)) as broker:
        created = rsnet("topics", "create", broker.url, "jobs.eu")
        assert (created.returncode, created.stdout) == (0, "jobs.eu: created\n"), created.stderr
        assert rsnet("topics", "create", broker.url, "jobs.eu").stdout == "jobs.eu: exists already\n"
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
        assert (purged.returncode, purged.stdout) == (0, "jobs.eu: purged (3 records removed)\n"), purged.stderr
        # The live reader is told, with the code, and ends with 1.
        assert follower.wait(timeout=10) == 1
        assert one_line(follower.stderr.read()) == "rsnet sub: UNKNOWN_PUBLISHER: topic 'jobs.eu' was deleted"
        follower.stdout.close()
        follower.stderr.close()
        empty = rsnet("sub", broker.url, "jobs.eu", "--from", "earliest", "--until-end")
        assert (empty.returncode, empty.stdout) == (0, "")

        assert rsnet("pub", broker.url, "jobs.eu", stdin="4\n").returncode == 0
        deleted = rsnet("topics", "delete", broker.url, "jobs.eu", "--yes")
        assert (deleted.returncode, deleted.stdout) == (0, "jobs.eu: deleted (1 record removed)\n")
        assert not (data / "jobs.eu").exists()
        assert "jobs.eu" not in rsnet("topics", broker.url).stdout
        again = rsnet("topics", "delete", broker.url, "jobs.eu", "--yes")
        assert (
            again.returncode == 1
            and one_line(again.stderr) == "rsnet topics: UNKNOWN_PUBLISHER: no topic named 'jobs.eu'"
        )


def test_only_an_admin_grant_covering_the_topic_allows_it(tmp_path):
    admin, producer = generate_token(), generate_token()
    config = tmp_path / "rsnet.toml"
    config.write_text(
        f"""
[[auth.tokens]]
name = "ops"
hash = "{hash_token(admin)}"
publish = [">"]
subscribe = [">"]
admin = ["ops.>"]

[[auth.tokens]]
name = "ingest"
hash = "{hash_token(producer)}"
publish = [">"]
subscribe = [">"]
"""
    )
    with Daemon("broker", "--config", str(config), "--tcp", "127.0.0.1:0") as broker:
        denied = rsnet("topics", "create", broker.url, "ops.jobs", env=env(RSNET_TOKEN=producer))
        assert denied.returncode == 1
        assert one_line(denied.stderr) == "rsnet topics: UNAUTHORIZED: not allowed to admin 'ops.jobs'"
        outside = rsnet("topics", "create", broker.url, "sensors.x", env=env(RSNET_TOKEN=admin))
        assert outside.returncode == 1 and "UNAUTHORIZED" in outside.stderr
        allowed = rsnet("topics", "create", broker.url, "ops.jobs", "--json", env=env(RSNET_TOKEN=admin))
        assert allowed.returncode == 0, allowed.stderr
        assert '"created": true' in allowed.stdout
