"""What an unknown command-line option was likely meant as, in another tool's spelling.

OpenNMT-py spells its options `-beam_size`, fairseq `--beam` and `--lenpen`, and both take
on the command line what here is a config key (`-train_steps`, `--max-update`). click reads
`-beam_size` as the short options `-b -e -a ...` and answers "No such option: -b"; this
names the option or the `--set` key meant instead, from the options' and keys' fields
(`nmt.translate.options.SearchOptions`, `nmt.config`, their `aka`).

This module imports no torch: the command line asks it before any command runs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

from nmt import config
from nmt.translate import options


def flags_of(command: Any) -> set[str]:
    """Every option a click command takes, as typed: `--beam-size`, `-b`, `--no-progress`."""
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)}


def typed(option_name: str, argv: Sequence[str]) -> str:
    """The token the user typed for click's unknown `option_name`: for a single-dash word
    (`-beam_size`, which click reports as `-b`) the word, else `option_name` itself."""
    if option_name.startswith("--") or len(option_name) != 2:
        return option_name
    words = [a for a in argv if a.startswith(option_name) and not a.startswith("--")]
    return next((w.split("=", 1)[0] for w in words if len(w) > 2), option_name)


def meant(token: str, flags: Collection[str], takes_set: bool) -> str | None:
    """Why `token` is unknown and what is meant, for a command with the options `flags`
    (`takes_set`: it has `--set section.key=value`); None: no better guess than click's."""
    name = token.lstrip("-").split("=", 1)[0].replace("-", "_")
    flag = "--" + name.replace("_", "-")
    if flag in flags and flag != token:
        return f"{token}: nmt spells it {flag}"
    decoding = config.other_names({"": options.SearchOptions})
    if name in decoding:
        field, tools = decoding[name]
        if options.flag(field) in flags:
            return f"{token}: {tools}'s {name} is {options.flag(field)} here"
    if not takes_set:
        return None
    if named := config.key_named(name):
        key, tools = named
        what = f"{tools}'s {name} is the config key {key} here" if tools else "a config key here"
        return f"{token}: {what}: --set {key}=VALUE"
    return None


def single_dash(argv: Sequence[str], flags: Collection[str]) -> str | None:
    """A word with one dash that is one of `flags` spelled OpenNMT-py's way (`-model`,
    `-src`, `-beam_size`), which click would read as a short option and its value (`-m
    odel`): what is meant, else None. Words after `--` are arguments, not options."""
    for token in argv:
        if token == "--":
            return None
        if re.fullmatch(r"-[a-z][a-z0-9_]+", token):
            flag = "--" + token[1:].replace("_", "-")
            if flag in flags:
                return f"{token}: nmt spells it {flag}"
    return None
