"""Shell completion (rsnet completion bash|zsh|fish): each script is loaded by its real shell and
asked what it offers, as a user pressing TAB would see. A shell that is not installed is
skipped with the reason (zsh and fish are in Debian: apt-get install zsh fish)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from .support import rsnet

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict[str, pathlib.Path]:
    directory = tmp_path_factory.mktemp("completion")
    paths = {}
    for shell in ("bash", "zsh", "fish"):
        made = rsnet("completion", shell)
        assert made.returncode == 0, made.stderr
        paths[shell] = directory / f"rsnet.{shell}"
        paths[shell].write_text(made.stdout)
    return paths


def needs(shell: str) -> str:
    found = shutil.which(shell)
    if found is None:
        pytest.skip(f"{shell} is not installed here (apt-get install {shell}): its completion script was not run")
    return found


def bash_offers(script: pathlib.Path, *words: str) -> set[str]:
    line = " ".join(f"'{w}'" for w in words)
    program = f'source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _rsnet; echo "${{COMPREPLY[@]}}"'
    return set(subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True).stdout.split())


def zsh_offers(script: pathlib.Path, line: str) -> set[str]:
    zsh = needs("zsh")
    shown = subprocess.run(
        [zsh, "-f", str(HERE / "zsh_complete.zsh"), str(script), line],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return set(shown.stdout.split())


def fish_offers(script: pathlib.Path, line: str) -> set[str]:
    fish = needs("fish")
    program = f"source {script}; complete -C '{line}'"
    shown = subprocess.run([fish, "--no-config", "-c", program], capture_output=True, text=True, timeout=30, check=True)
    return {entry.split("\t")[0] for entry in shown.stdout.splitlines()}


def test_bash_offers_option_values_and_actions(scripts):
    assert bash_offers(scripts["bash"], "rsnet", "topics", "--policy", "") == {"backpressure", "drop", "disconnect"}
    assert bash_offers(scripts["bash"], "rsnet", "topics", "cr") == {"create"}
    assert bash_offers(scripts["bash"], "rsnet", "completion", "") == {"bash", "zsh", "fish", "--help", "-h"}
    # --format takes templates too, so it has no choices; its named formats are still offered
    # (it offered option names: an outside check).
    assert bash_offers(scripts["bash"], "rsnet", "sub", "--format", "") == {"json", "value", "raw"}


def test_zsh_script_parses_and_offers_commands_options_and_values(scripts):
    zsh = needs("zsh")
    checked = subprocess.run([zsh, "-n", str(scripts["zsh"])], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    script = scripts["zsh"]
    assert {"broker", "pub", "sub", "topics", "completion"} <= zsh_offers(script, "rsnet ")
    assert zsh_offers(script, "rsnet sub --u") == {"--until-end", "--url"}
    assert zsh_offers(script, "rsnet topics --policy ") == {"backpressure", "drop", "disconnect"}
    assert zsh_offers(script, "rsnet topics ") >= {"create", "alter", "delete", "purge"}
    assert zsh_offers(script, "rsnet broker --fsync ") == {"always", "interval", "never"}
    assert zsh_offers(script, "rsnet sub --format ") == {"json", "value", "raw"}


def test_fish_script_parses_and_offers_commands_options_and_values(scripts):
    fish = needs("fish")
    checked = subprocess.run([fish, "--no-execute", str(scripts["fish"])], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    script = scripts["fish"]
    assert {"broker", "pub", "sub", "topics", "completion"} <= fish_offers(script, "rsnet ")
    assert fish_offers(script, "rsnet sub --u") == {"--until-end", "--url"}
    assert fish_offers(script, "rsnet topics --policy ") == {"backpressure", "drop", "disconnect"}
    assert {"create", "alter", "delete", "purge"} <= fish_offers(script, "rsnet topics ")
    assert fish_offers(script, "rsnet broker --fsync ") == {"always", "interval", "never"}
    assert fish_offers(script, "rsnet sub --format ") == {"json", "value", "raw"}
