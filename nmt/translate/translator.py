"""From lists of sentences to n-best lists: batching by length, eval mode, search dispatch.

Sources are sorted by length and cut into batches so that little padding is decoded; the
searches mask what padding there is, so a sentence gets the same translation in any batch.
`SearchOptions` (defined with the searches, which take it whole) is importable from here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from nmt.data.vocab import BOS, EOS, PAD
from nmt.errors import NmtError
from nmt.translate.search import (
    Hypothesis,
    SearchOptions,
    draw_generator,
    graph_refusal,
    search,
)
from nmt.translate.search_graphs import SOURCE_MULTIPLE, SearchGraphs, rounded_up

if TYPE_CHECKING:
    from nmt.translate.ensemble import Decodable


class TextTokenizer(Protocol):
    """What translation needs of a tokenizer: ids without <s> / </s> in and out."""

    def encode(self, line: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def pad_sources(
    seqs: list[list[int]], device: torch.device | str, multiple: int = 1
) -> tuple[Tensor, Tensor]:
    """Ids without specials -> src B x S (<s> ids </s>, right-padded with PAD) and its mask;
    S the longest rounded up to a `multiple`."""
    S = rounded_up(max((len(s) for s in seqs), default=0) + 2, multiple)
    src = torch.full((len(seqs), S), PAD, dtype=torch.long)
    for i, ids in enumerate(seqs):
        src[i, : len(ids) + 2] = torch.tensor([BOS, *ids, EOS], dtype=torch.long)
    lengths = torch.tensor([len(s) + 2 for s in seqs])
    mask = torch.arange(S).unsqueeze(0) < lengths.unsqueeze(1)
    return src.to(device), mask.to(device)


@contextmanager
def evaluating(model: Decodable) -> Iterator[None]:
    """Dropout off and no autograd inside; the model's training flag is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


GRAPH_MODES = ("auto", "on", "off")


def step_graphs(
    mode: str, device: torch.device, options: SearchOptions, log: Callable[[str], None]
) -> SearchGraphs | None:
    """Whether the search steps replay as CUDA graphs (`--cuda-graphs`: auto, on where CUDA
    is; on; off): the graphs and workspaces to keep across batches, or None - every step
    eager, with one line through `log` where graphs were asked for or CUDA would take them
    and cannot serve."""
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return None
    why = f"no CUDA device ({device})" if device.type != "cuda" else graph_refusal(options)
    if why is not None:
        log(f"--cuda-graphs {mode}: every search step runs eager: {why}")
        return None
    return SearchGraphs(device, log)


def length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices sorted by length (longest first, stable) and cut into batches."""
    if batch_size < 1:
        raise NmtError(f"batch size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def translate_ids(
    model: Decodable,
    sources: list[list[int]],
    options: SearchOptions = SearchOptions(),
    batch_size: int = 32,
    on_batch: Callable[[int], None] | None = None,
    graphs: SearchGraphs | None = None,
    generator: torch.Generator | None = None,
) -> list[list[Hypothesis]]:
    """Translate id sequences (without specials); per source its n-best list, in input order.

    `on_batch(n)` is called after each batch of n sentences (a progress bar's update).
    Beam size 1 is greedy search: the same loop (`search.Search`). `graphs`: the steps
    replayed as CUDA graphs (`step_graphs`), each batch's sources padded to a multiple of
    `SOURCE_MULTIPLE` positions so that batches of nearby lengths share their graphs.
    `generator`: sampling's draws, one stream for every batch, continued where a caller
    translates in parts (None: a stream from `options.seed`).
    """
    options.check()
    device = next(model.parameters()).device
    if generator is None:
        generator = draw_generator(options, device)
    results: list[list[Hypothesis]] = [[] for _ in sources]
    with evaluating(model):
        for batch in length_batches([len(s) for s in sources], batch_size):
            lengths = [len(sources[i]) + 2 for i in batch]  # <s> and </s>
            multiple = SOURCE_MULTIPLE if graphs is not None else 1
            src, mask = pad_sources([sources[i] for i in batch], device, multiple)
            if graphs is None and min(lengths) == src.size(1):  # no padding (one sentence,
                mask = None  # or equal lengths): the encoder and attention skip their masking
            found = search(model, src, mask, options, lengths, graphs, generator)
            for i, hyps in zip(batch, found, strict=True):
                results[i] = hyps
            if on_batch is not None:
                on_batch(len(batch))
    return results


def translate_lines(
    model: Decodable,
    src_tokenizer: TextTokenizer,
    tgt_tokenizer: TextTokenizer,
    lines: list[str],
    options: SearchOptions = SearchOptions(),
    batch_size: int = 32,
    graphs: SearchGraphs | None = None,
) -> list[str]:
    """Translate text lines: the best hypothesis of each, decoded by the target tokenizer."""
    sources = [src_tokenizer.encode(line) for line in lines]
    found = translate_ids(model, sources, options, batch_size, graphs=graphs)
    return [tgt_tokenizer.decode(hyps[0].tokens) for hyps in found]
