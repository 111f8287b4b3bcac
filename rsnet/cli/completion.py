"""``rsnet completion bash|zsh|fish``: a shell completion script for commands, options and their values.

    source <(rsnet completion bash)      # or save it in ~/.local/share/bash-completion/completions/rsnet
    source <(rsnet completion zsh)       # after compinit; or save it as _rsnet in a directory of $fpath
    rsnet completion fish > ~/.config/fish/completions/rsnet.fish

Generated from the argument parser itself, so it cannot fall behind the options: every command,
every option of each (with its help in zsh and fish), the values of options that have a fixed
set (``--policy``, ``--format``...), the words a command's first argument may be (``rsnet topics
create``...), and file names where an option takes a file.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

SHELLS = ("bash", "zsh", "fish")

COMPLETIONS = "completions"
"""An attribute a command may set on an argument: words to offer for it (without making
argparse refuse others, as ``choices`` would): ``rsnet topics``' actions, ``sub --format``'s
named formats (it takes templates too)."""

_FILES = {"config", "token_file", "app_dir", "data_dir"}  # options that take a path
_DIRECTORIES = {"app_dir", "data_dir"}


def add_parser(commands: argparse._SubParsersAction) -> None:
    completion = commands.add_parser("completion", help="print a shell completion script (bash, zsh, fish)")
    completion.add_argument("shell", choices=SHELLS)


def script(shell: str, root: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (one of :data:`SHELLS`)."""
    return {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[shell](root)


# -- what the parser says ------------------------------------------------------------------------


@dataclasses.dataclass
class _Option:
    short: list[str]
    long: list[str]
    help: str
    takes_value: bool
    choices: list[str]
    repeatable: bool
    path: str | None  # "file", "directory" or None
    metavar: str


@dataclasses.dataclass
class _Command:
    name: str
    help: str
    options: list[_Option]
    words: list[str]  # for its first positional argument


def _help(action: argparse.Action) -> str:
    text = action.help if isinstance(action.help, str) and action.help != argparse.SUPPRESS else ""
    return " ".join(text.split())


def _options(parser: argparse.ArgumentParser) -> list[_Option]:
    options = []
    for action in parser._actions:
        if not action.option_strings:
            continue
        takes_value = action.nargs != 0
        dest = action.dest
        options.append(
            _Option(
                short=[o for o in action.option_strings if not o.startswith("--")],
                long=[o for o in action.option_strings if o.startswith("--")],
                help=_help(action),
                takes_value=takes_value,
                choices=[str(c) for c in (action.choices or getattr(action, COMPLETIONS, None) or [])]
                if takes_value
                else [],
                repeatable=isinstance(action, argparse._AppendAction),
                path=("directory" if dest in _DIRECTORIES else "file") if dest in _FILES else None,
                metavar=str(action.metavar or dest.upper()),
            )
        )
    return options


def _words(parser: argparse.ArgumentParser) -> list[str]:
    """What the first positional argument may be: its choices, or its :data:`COMPLETIONS`."""
    for action in parser._actions:
        if not action.option_strings:
            return [str(word) for word in (action.choices or getattr(action, COMPLETIONS, None) or [])]
    return []


def _commands(root: argparse.ArgumentParser) -> list[_Command]:
    subcommands = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: _help(choice) for choice in subcommands._choices_actions}
    choices: dict[str, argparse.ArgumentParser] = subcommands.choices
    return [
        _Command(name, helps.get(name, ""), _options(parser), _words(parser))
        for name, parser in sorted(choices.items())
    ]


# -- bash ----------------------------------------------------------------------------------------


def bash_script(root: argparse.ArgumentParser) -> str:
    """Command names first, then the options (and first-argument words) of the command being
    typed; after an option with a fixed set of values, those values."""
    commands = _commands(root)
    cases, values = [], []
    for command in commands:
        options = sorted(name for option in command.options for name in option.short + option.long)
        cases.append(f'    {command.name}) words="{" ".join(command.words + options)}" ;;')
        for option in command.options:
            if option.choices:
                names = "|".join(f"{command.name}:{name}" for name in option.short + option.long)
                values.append(
                    f'    {names}) COMPREPLY=($(compgen -W "{" ".join(option.choices)}" -- "$cur")); return ;;'
                )
    top = " ".join([c.name for c in commands] + sorted(n for o in _options(root) for n in o.short + o.long))
    return f"""# bash completion for rsnet (rsnet completion bash)
_rsnet() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} words
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "{top}" -- "$cur"))
    return
  fi
  case "${{COMP_WORDS[1]}}:$prev" in
{chr(10).join(values)}
  esac
  case ${{COMP_WORDS[1]}} in
{chr(10).join(cases)}
    *) words="" ;;
  esac
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _rsnet rsnet
"""


# -- zsh -----------------------------------------------------------------------------------------


def _zsh_quote(text: str) -> str:
    """``text`` inside single quotes."""
    return text.replace("'", "'\\''")


def _zsh_describe(text: str) -> str:
    """Help text fit for ``[...]`` in an ``_arguments`` spec (no brackets, no colons)."""
    return _zsh_quote(re.sub(r"[\[\]]", "", text).replace(":", ","))


def _zsh_spec(option: _Option) -> str:
    names = option.short + option.long
    exclusive = "" if option.repeatable or len(names) == 1 else f"({' '.join(names)})"
    prefix = "*" if option.repeatable else ""
    value = ""
    if option.takes_value:
        message = _zsh_describe(option.metavar.lower()) or "value"
        if option.choices:
            action = f"({' '.join(option.choices)})"
        elif option.path == "directory":
            action = "_files -/"
        elif option.path == "file":
            action = "_files"
        else:
            action = " "
        value = f":{message}:{action}"
    described = f"[{_zsh_describe(option.help)}]"
    if len(names) == 1:
        return f"'{exclusive}{prefix}{names[0]}{described}{value}'"
    return f"'{exclusive}{prefix}'{{{','.join(names)}}}'{described}{value}'"


def zsh_script(root: argparse.ArgumentParser) -> str:
    """An ``_arguments`` completion: commands with their help, then each command's options
    with their help and values, and its first argument's words. Works sourced (after
    ``compinit``) or autoloaded from ``$fpath`` as ``_rsnet``."""
    commands = _commands(root)
    described = "\n".join(f"        '{c.name}:{_zsh_quote(c.help.replace(':', ','))}'" for c in commands)
    cases = []
    for command in commands:
        specs = [_zsh_spec(option) for option in command.options]
        if command.words:
            specs.append(f"'1: :({' '.join(command.words)})'")
        specs.append("'*: :_default'")
        joined = " \\\n            ".join(specs)
        cases.append(f"        {command.name})\n          _arguments -s \\\n            {joined} ;;")
    top = " \\\n    ".join(_zsh_spec(option) for option in _options(root))
    return f"""#compdef rsnet
# zsh completion for rsnet (rsnet completion zsh)
_rsnet() {{
  local curcontext="$curcontext" state line
  typeset -A opt_args
  _arguments -C \\
    {top} \\
    '1: :->command' \\
    '*:: :->args' && return
  case $state in
    command)
      local -a commands
      commands=(
{described}
      )
      _describe -t commands 'rsnet command' commands ;;
    args)
      case $line[1] in
{chr(10).join(cases)}
      esac ;;
  esac
}}
if [ "$funcstack[1]" = "_rsnet" ]; then
  _rsnet "$@"
else
  compdef _rsnet rsnet
fi
"""


# -- fish ----------------------------------------------------------------------------------------


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_option(condition: str, option: _Option) -> str:
    parts = ["complete -c rsnet", f"-n {_fish_quote(condition)}"]
    parts += [f"-s {name[1:]}" for name in option.short] + [f"-l {name[2:]}" for name in option.long]
    if option.choices:
        parts.append(f"-x -a {_fish_quote(' '.join(option.choices))}")
    elif option.path is not None:
        parts.append("-r -F")
    elif option.takes_value:
        parts.append("-x")
    if option.help:
        parts.append(f"-d {_fish_quote(option.help)}")
    return " ".join(parts)


def fish_script(root: argparse.ArgumentParser) -> str:
    """``complete`` lines: commands while none is typed, then each command's options (with
    their values) and its first argument's words."""
    commands = _commands(root)
    lines = ["# fish completion for rsnet (rsnet completion fish)", "complete -c rsnet -f"]
    for option in _options(root):
        lines.append(_fish_option("__fish_use_subcommand", option))
    for command in commands:
        lines.append(
            f"complete -c rsnet -n __fish_use_subcommand -a {command.name} -d {_fish_quote(command.help)}".rstrip()
        )
    for command in commands:
        seen = f"__fish_seen_subcommand_from {command.name}"
        if command.words:
            lines.append(f"complete -c rsnet -n {_fish_quote(seen)} -a {_fish_quote(' '.join(command.words))}")
        lines.extend(_fish_option(seen, option) for option in command.options)
    return "\n".join(lines) + "\n"
