"""Print the configuration reference (generated from nmt.config), or rewrite it in README.md.

python scripts/config_reference.py            # print
python scripts/config_reference.py --write    # replace the README's section in place
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nmt.config import reference_markdown

README = Path(__file__).resolve().parents[1] / "README.md"
START = "A config file has three sections; every key is optional except the four data files.\n"
END = "\n## Development"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite the section in {README.name}")
    args = ap.parse_args()
    reference = reference_markdown().rstrip() + "\n"
    if not args.write:
        print(reference, end="")
        return
    text = README.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{reference}{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    main()
