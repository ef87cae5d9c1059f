"""`--help` as plain text that reads at any width from 40 columns up.

Typer's boxed tables give the description the columns the option names leave, about 20 at a
terminal's 80, and cut what does not fit with "…"; their docstrings keep the source's line
breaks, and a list argument shows its Python type (`<list[Path]>`). Here each command's help
is laid out as git and click do: the usage, the docstring's paragraphs wrapped to the
terminal, then the options in their groups (`rich_help_panel=`, the one place an option
names its group), each option's text wrapped beside or below its names, its default and
whether it is required at the end. Nothing is cut; a word longer than a line runs over.
"""

from __future__ import annotations

import inspect
import re
import shutil
import textwrap
from typing import Any

# at most this many columns, however wide the terminal: longer lines are hard to follow
MAX_WIDTH = 100
MIN_WIDTH = 40
# the widest the names column grows before an option's text starts on the line below
NAMES_COLUMN = 28
# the group of options that name none (and of --help), and of arguments
OTHER_OPTIONS = "Other options"
ARGUMENTS = "Arguments"
# a value's kind as the help names it, from the type's name typer or click gives it
KIND_WORDS = {
    "path": "PATH",
    "file": "FILE",
    "directory": "DIR",
    "int": "N",
    "integer": "N",
    "float": "X",
    "str": "TEXT",
    "text": "TEXT",
}


def help_width() -> int:
    """The terminal's width (COLUMNS when set), within MIN_WIDTH..MAX_WIDTH."""
    columns = shutil.get_terminal_size((80, 24)).columns
    return max(MIN_WIDTH, min(MAX_WIDTH, columns))


def paragraphs(text: str) -> list[str]:
    """A docstring's paragraphs (blank-line separated), each joined into one line: the
    source's line breaks are the source's, not the reader's."""
    text = inspect.cleandoc(text or "")
    return [" ".join(block.split()) for block in re.split(r"\n\s*\n", text) if block.strip()]


def wrap(text: str, width: int, indent: str = "", first: str | None = None) -> list[str]:
    """`text` wrapped to `width` columns, never cutting a word or an option at a hyphen."""
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent.rstrip()]


def value_name(param: Any, ctx: Any) -> str:
    """What an option's value is called: its metavar, else its kind in words (PATH, N)."""
    if param.metavar:
        return param.metavar
    if hasattr(param, "display_type"):  # typer's own parameter types
        label = param.display_type(ctx).strip("<>")
    else:  # click's
        label = param.type.name
    label = re.sub(r"^list\[(.*)\]$", r"\1", label)  # a repeated value: one of them
    if "|" in label:  # choices
        return "{" + label + "}"
    return KIND_WORDS.get(label.lower(), label.upper())


def is_flag(param: Any) -> bool:
    return bool(getattr(param, "is_flag", False)) and not getattr(param, "count", False)


def option_names(param: Any, ctx: Any) -> str:
    """`-m, --model CKPT`, `--progress / --no-progress`, `CHECKPOINTS...`."""
    if getattr(param, "param_type_name", "") == "argument":
        name = param.metavar or param.name.upper()
        return name + ("..." if param.nargs == -1 else "")
    opts = sorted(param.opts, key=lambda opt: (opt.startswith("--"), opt))
    names = ", ".join(opts)
    if param.secondary_opts:
        names += " / " + ", ".join(param.secondary_opts)
    return names if is_flag(param) else f"{names} {value_name(param, ctx)}"


def default_text(param: Any) -> str | None:
    """`[default: 32]`, `[default: --progress]`, `[required]` or nothing (no default)."""
    if getattr(param, "required", False):
        return "[required]"
    default = param.default
    if callable(default) or default is None or default == () or default == []:
        return None
    if is_flag(param):
        if param.secondary_opts:
            return f"[default: {(param.opts if default else param.secondary_opts)[-1]}]"
        return None  # an on/off flag without an opposite: off unless given
    return f"[default: {default}]"


NO_BREAK = "\xa0"  # a space the wrapping keeps: `[default: 32]` stays on one line


def entry_text(param: Any) -> str:
    help_text = " ".join(paragraphs(getattr(param, "help", None) or ""))
    default = default_text(param)
    return f"{help_text} {default.replace(' ', NO_BREAK)}".strip() if default else help_text


def entries(names: str, text: str, width: int, column: int) -> list[str]:
    """One option: its names, its text wrapped beside them in the text column, or below
    them when the names reach into it."""
    indent = " " * column
    if len(names) + 4 <= column:
        lines = wrap(text, width, indent, first=f"  {names}".ljust(column))
    else:
        lines = [f"  {names}", *wrap(text, width, indent)] if text else [f"  {names}"]
    return [line.replace(NO_BREAK, " ") for line in lines]


def panel_of(param: Any) -> str:
    if getattr(param, "param_type_name", "") == "argument":
        return ARGUMENTS
    return getattr(param, "rich_help_panel", None) or OTHER_OPTIONS


def render(command: Any, ctx: Any, width: int | None = None) -> str:
    """The whole help of `command` (a click or typer command or group) as plain text."""
    width = width or help_width()
    lines = [*wrap(usage(command, ctx), width, " " * 9, first="Usage: "), ""]
    for paragraph in paragraphs(command.help or ""):
        lines += [*wrap(paragraph, width, "  "), ""]
    groups: dict[str, list[tuple[str, str]]] = {}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        groups.setdefault(panel_of(param), []).append((option_names(param, ctx), entry_text(param)))
    commands = getattr(command, "commands", {})
    shown = [(name, sub) for name, sub in commands.items() if not sub.hidden]
    if shown:
        groups["Commands"] = [(name, first_sentence(sub.help or "")) for name, sub in shown]
    order = [ARGUMENTS, *[g for g in groups if g not in (ARGUMENTS, OTHER_OPTIONS)]]
    order.append(OTHER_OPTIONS)
    column = 2 + min(NAMES_COLUMN, max(len(n) for rows in groups.values() for n, _ in rows) + 2)
    if width - column < 30:  # a narrow terminal: every text below its names
        column = 8
    alone = not set(groups) - {ARGUMENTS, OTHER_OPTIONS, "Commands"}
    for group in order:
        if group not in groups:
            continue
        lines.append("Options:" if group == OTHER_OPTIONS and alone else f"{group}:")
        for names, text in groups[group]:
            lines += entries(names, text, width, column)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def usage(command: Any, ctx: Any) -> str:
    """`nmt average [OPTIONS] CHECKPOINTS...`: the arguments by the names their help gives."""
    pieces = [ctx.command_path, "[OPTIONS]"]
    for param in command.get_params(ctx):
        if getattr(param, "param_type_name", "") == "argument":
            name = option_names(param, ctx)
            pieces.append(name if param.required or name.startswith("[") else f"[{name}]")
    if getattr(command, "commands", None):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def first_sentence(text: str) -> str:
    """A command's line in its group's list: the first sentence of its help."""
    first = (paragraphs(text) or [""])[0]
    match = re.match(r"(.+?[.;:])(\s|$)", first)
    return (match.group(1) if match else first).rstrip(".;:") + "."


# the groups options are shown in (`rich_help_panel=`), in the words of what they are about
RUN_CONFIG = "Config"
RUN_DIRECTORY = "Run directory"
MEMORY = "Memory"
INPUT = "Input"
DECODING = "Decoding"
DEVICE = "Device"
ACCOUNTING = "Accounting"
OUTPUT = "Output"
