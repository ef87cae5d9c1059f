"""Print the configuration reference (generated from nmt.config, and nmt translate's decoding
options from nmt.translate.options), or write it to docs/config.md.

python scripts/config_reference.py            # print
python scripts/config_reference.py --write    # rewrite docs/config.md, the whole file
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nmt.config import other_names_markdown, reference_markdown
from nmt.translate import options

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "config.md"
HEADER = (
    "*Generated from `nmt/config.py` and `nmt/translate/options.py` by `python"
    " scripts/config_reference.py --write`: edit the field docs there, not this file.*"
)
INTRO = (
    "A config file is UTF-8 YAML with four sections; every key is optional except the four\n"
    "data files, and a key given twice is refused (naming both lines). Any key can be\n"
    "overridden on the command line: `--set section.key=value`; a bad value given so is\n"
    "reported as `--set: key '...'`, one from the file naming the file. Relative data paths\n"
    "are taken from the working directory `nmt` runs in (not from the config file's folder),\n"
    "and a data file that is not found is reported with that directory. `nmt config` prints\n"
    "every key with its default as a config file, each under its doc; `nmt config RUN_DIR`\n"
    "(or a checkpoint) prints the config a run trained with, which every run also writes to\n"
    "its `config.yaml`."
)

DECODING_INTRO = (
    "Each is a flag of `nmt translate`; those with a key are carried by the model (its\n"
    "config's `translate:` section, stored in its checkpoint) and default to the model's\n"
    "value, the others to the default shown. One line on stderr (`decoding:`) says the values\n"
    "used and where each came from."
)


OTHER_NAMES_INTRO = (
    "Keys, sections and flags that OpenNMT-py, JoeyNMT, fairseq or seq2seq-attn name\n"
    "otherwise. A config or `--set` that uses such a name is refused with the key it is here,\n"
    "e.g. `--set: unknown key 'train.lr' (fairseq's lr is 'train.learning_rate' here)`, and so\n"
    "is such a flag (`nmt train --lr 0.1`: `--set train.learning_rate=VALUE`; `nmt translate\n"
    "--alpha 0.6`: `--length-penalty`), or one of ours spelled the other tools' way\n"
    "(`-beam_size`: `--beam-size`). The meaning is this project's (the docs above), which may\n"
    "differ in detail."
)
FLAGS_INTRO = "`nmt translate`'s flags:"


def document() -> str:
    """The whole text of docs/config.md."""
    reference = reference_markdown().rstrip()
    decoding = options.reference_markdown()
    return (
        f"{HEADER}\n\n# Configuration reference\n\n{INTRO}\n\n{reference}\n\n"
        f"## `nmt translate`'s decoding options\n\n{DECODING_INTRO}\n\n{decoding}\n\n"
        f"## Names from other tools\n\n{OTHER_NAMES_INTRO}\n\n{other_names_markdown()}\n\n"
        f"{FLAGS_INTRO}\n\n{options.other_names_markdown()}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite docs/config.md")
    args = ap.parse_args()
    if not args.write:
        print(document(), end="")
        return
    REFERENCE.write_text(document(), encoding="utf-8")


if __name__ == "__main__":
    main()
