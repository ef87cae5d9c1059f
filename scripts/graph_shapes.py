"""How many CUDA graphs an epoch needs: the distinct step shapes of a config's batches.

A graphed step (`train.cuda_graphs`) is captured once per shape that fixes its kernels
(`CloneExecutor.loaded_shape`): the rows, the source length, the target length and, where
the output layer skips the leading PAD rows of each target position (the fused granularity,
eager), those counts. A graphed step takes its batch as `graph_shaped` makes it: every row
through the output layer, targets padded to a multiple of `train.cuda_graph_bucket`. This
counts the shapes of the training batches as an eager step keys them and as a graphed one
does for each `--buckets` value (1: targets unpadded). It reads the corpus and builds the
vocabularies; no model is built and nothing is trained.

    python scripts/graph_shapes.py --config configs/ende-demo.yaml \\
        --set data.train_src=../shared/corpora/ende-demo/src-train.txt ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nmt import granularities  # noqa: E402
from nmt.config import load_config  # noqa: E402
from nmt.data.batch_index import BatchRule, EpochBatches  # noqa: E402
from nmt.data.batching import Batch  # noqa: E402
from nmt.data.corpus import load_corpus  # noqa: E402
from nmt.train.step import graph_shaped  # noqa: E402


def shape(batch: Batch, skips_pad_rows: bool) -> tuple:
    """What fixes a step's kernels (as `CloneExecutor.load` keys it)."""
    rows = batch.pad_rows if skips_pad_rows else None
    return (batch.size, batch.src.size(1), batch.tgt_in.size(1), rows)


def graphed(batches: list[Batch], bucket: int, limit: int) -> int:
    """The shapes a graphed epoch has."""
    return len({shape(graph_shaped(b, bucket, limit), False) for b in batches})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], help="a config override")
    ap.add_argument("--buckets", default="1,8,16", help="target-length multiples to count")
    args = ap.parse_args()
    cfg = load_config(args.config, args.set)
    corpus = load_corpus(cfg.data, None, log=lambda _: None)
    batches = list(EpochBatches(corpus.train, BatchRule(cfg.train.batch_size)))
    limit = cfg.data.max_tgt_len + 1
    fused = granularities.get(cfg.model.granularity).fused_output_layer
    print(
        f"{args.config}: {len(corpus.train)} pairs in {len(batches)} batches of up to "
        f"{cfg.train.batch_size}; {len({b.src.size(1) for b in batches})} source lengths"
    )
    eager = len({shape(b, fused) for b in batches})
    print(f"eager ({cfg.model.granularity}): {eager} shapes")
    for bucket in (int(b) for b in args.buckets.split(",")):
        print(
            f"graphed, train.cuda_graph_bucket {bucket}: {graphed(batches, bucket, limit)} shapes"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
