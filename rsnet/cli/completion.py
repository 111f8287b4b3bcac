"""``rsnet completion bash``: a bash completion script for commands and options.

    source <(rsnet completion bash)      # or save it in ~/.local/share/bash-completion/completions/rsnet

Generated from the argument parser itself, so it cannot fall behind the options.
"""

from __future__ import annotations

import argparse

SHELLS = ("bash",)


def add_parser(commands: argparse._SubParsersAction) -> None:
    completion = commands.add_parser("completion", help="print a shell completion script (bash)")
    completion.add_argument("shell", choices=SHELLS)


def _words(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(option for action in parser._actions for option in action.option_strings)


def bash_script(root: argparse.ArgumentParser) -> str:
    """The script: command names first, then the options of the command being typed."""
    subcommands = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    choices: dict[str, argparse.ArgumentParser] = subcommands.choices  # name -> parser
    cases = "\n".join(f'    {name}) words="{" ".join(_words(parser))}" ;;' for name, parser in sorted(choices.items()))
    top = " ".join(sorted(choices) + _words(root))
    return f"""# bash completion for rsnet (rsnet completion bash)
_rsnet() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} words
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "{top}" -- "$cur"))
    return
  fi
  case ${{COMP_WORDS[1]}} in
{cases}
    *) words="" ;;
  esac
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _rsnet rsnet
"""
