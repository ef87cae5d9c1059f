"""The Python API: `nmt.load(path)` and `.translate(lines)`, what `nmt translate` writes.

A thin layer over `nmt.translate.run`: the same loading (`load_models`), the same options
(`TranslateOptions`, the model's decoding defaults under the flags given), the same
`Translator` over the same chunks of lines - so that for the same checkpoint, lines and
options the strings returned are the lines `nmt translate` writes. Keyword arguments are the
command's flags in Python's spelling (`--beam-size` is `beam_size=`).

    import nmt
    model = nmt.load("runs/toy/model.pt")
    print(model.translate(["one hundred and twenty-three"]))
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nmt.config import other_names
from nmt.devices import resolve_device
from nmt.errors import NmtError
from nmt.translate import decoding as model_decoding
from nmt.translate import options as search_options
from nmt.translate.options import SearchOptions
from nmt.translate.run import CHUNK_BATCHES, Loaded, TranslateOptions, Translator, chunks
from nmt.translate.run import load_models as _load_models

# the `nmt translate` options besides the decoding ones (`nmt.translate.options`) that
# apply to translating lines into strings, with the command's defaults
OTHER_FLAGS = {"phrase_table": None, "batch_size": 32, "max_src_length": 0}


class TranslationModel:
    """A checkpoint loaded for translation. `translate(lines)` returns the best translation
    of each line; keyword arguments (the command's flags: each decoding option of
    `nmt.translate.options`, e.g. `beam_size`, `length_penalty`, `block_ngram_repeat`,
    `random_sampling_topk`, `seed`, and `phrase_table`, `batch_size`, `max_src_length`)
    given to `nmt.load` hold for every call, given to `translate` for that call; a decoding
    option given to neither is the model's."""

    def __init__(
        self, loaded: Loaded, device: str, precision: str | None, quantize: str, **flags: Any
    ):
        self.loaded, self.device, self.precision = loaded, device, precision
        self.quantize = quantize
        self.flags = _checked(flags)
        self.options()  # refuse impossible values now, not at the first call

    def options(self, **flags: Any) -> TranslateOptions:
        """The options a call with `flags` translates with, as `nmt translate` would
        resolve them: each decoding option from its flag, else from the checkpoint."""
        given = {**self.flags, **_checked(flags)}
        decoding = {f.name: given.get(f.name) for f in search_options.fields()}
        other = {key: given.get(key, default) for key, default in OTHER_FLAGS.items()}
        table = other["phrase_table"]
        options = TranslateOptions(
            search=SearchOptions(**{k: v for k, v in decoding.items() if v is not None}),
            phrase_table=None if table is None else Path(table),
            max_src_length=other["max_src_length"],
            batch_size=other["batch_size"],
            device=self.device,
            precision=self.precision,
            quantize=self.quantize,
            progress=False,
            from_model=model_decoding.not_given(decoding),
        )
        options.check()
        return options.with_model(self.loaded.decoding)

    @property
    def decoding(self) -> SearchOptions:
        """The decoding options a call without keyword arguments uses."""
        return self.options().search

    def translate(self, lines: Iterable[str] | str, **flags: Any) -> list[str]:
        """The best translation of each line (a blank line: an empty string), as `nmt
        translate` writes them; one string is one line."""
        lines = [lines] if isinstance(lines, str) else list(lines)
        for number, line in enumerate(lines, 1):
            if not isinstance(line, str):
                raise NmtError(f"line {number}: expected a string, got {type(line).__name__}")
            if "\n" in line:
                raise NmtError(f"line {number}: holds a line break; give one line per string")
        options = self.options(**flags)
        loaded = self.loaded
        translator = Translator(loaded.model, loaded.src_tok, loaded.tgt_tok, options)
        best: list[str] = []
        for chunk in chunks((line.strip() for line in lines), options.batch_size * CHUNK_BATCHES):
            best += [t.best for t in translator.translate(chunk, len(best))]
        return best


def _checked(flags: dict[str, Any]) -> dict[str, Any]:
    """`flags`, refusing a name that is no flag of `nmt translate`'s line translation."""
    known = {f.name for f in search_options.fields()} | set(OTHER_FLAGS)
    if unknown := sorted(set(flags) - known):
        name = unknown[0]
        other = other_names({"": SearchOptions}).get(name)
        hint = f" ({other[1]}'s {name} is {other[0]} here)" if other else ""
        raise TypeError(f"unknown option {name!r}{hint}; the options: {', '.join(sorted(known))}")
    return dict(flags)


def load(
    path: str | Path | list[str | Path],
    *,
    device: str = "auto",
    precision: str | None = None,
    quantize: str = "none",
    **flags: Any,
) -> TranslationModel:
    """Load a checkpoint (a run's model.pt or last.pt; several: their ensemble) for
    translation on `device` (auto, cpu, cuda, cuda:N) in `precision` (None: the one it was
    trained in), its output layer's and gates' products in `quantize` (none, int8: `nmt translate
    --quantize`), as `nmt translate --model` does."""
    paths = [Path(p) for p in path] if isinstance(path, list) else [Path(path)]
    TranslateOptions(quantize=quantize).check()  # a bad value refused before loading
    loaded = _load_models(paths, resolve_device(device, "device"), precision, quantize)
    return TranslationModel(loaded, device, precision, quantize, **flags)
