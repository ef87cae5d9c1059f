"""The `nmt` command line. Each command loads its inputs, calls ONE function, prints.

Mistakes a user can fix (NmtError) become one line on stderr and exit code 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from nmt import policies
from nmt.errors import NmtError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train and run LSTM-attention translation models the seq2seq-attn way.",
)


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _fail(exc: NmtError) -> typer.Exit:
    _err(f"error: {exc}")
    return typer.Exit(code=2)


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a config key: section.key=value (repeatable)."),
]


@app.command()
def train(
    config: ConfigOpt,
    out: Annotated[
        Path | None,
        typer.Option(help="Run directory (default: the --resume file's, else runs/<config name>)."),
    ] = None,
    set_: SetOpt = None,
    preallocate: Annotated[
        bool | None,
        typer.Option(
            "--preallocate/--no-preallocate",
            help=f"--preallocate: the config's train.prealloc policy, or '{policies.DEFAULT}' "
            f"when it says '{policies.OFF}'; --no-preallocate: '{policies.OFF}'. Policies: "
            f"{policies.describe()}.",
        ),
    ] = None,
    resume: Annotated[Path | None, typer.Option(help="Continue from this last.pt.")] = None,
    force: Annotated[
        bool, typer.Option(help="Overwrite a run directory that holds a run.")
    ] = False,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")
    ] = True,
) -> None:
    """Train a model; checkpoints go to OUT/last.pt (the latest) and OUT/model.pt (the best
    validation by train.early_stopping_metric)."""
    from nmt.config import load_config
    from nmt.memreport.plan import plan_memory
    from nmt.train.trainer import TrainingInterrupted
    from nmt.train.trainer import train as run_training

    try:
        cfg = load_config(config, list(set_ or []))
        cfg.train.prealloc = policies.with_flag(cfg.train.prealloc, preallocate)
        # a resumed run continues in its own directory unless told otherwise
        out_dir = out or (resume.parent if resume else Path("runs") / config.stem)
        if resume is None and not force and (out_dir / "last.pt").exists():
            raise NmtError(
                f"{out_dir}: already holds a run (last.pt); pass --resume "
                f"{out_dir / 'last.pt'} to continue it or --force to start over"
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks
            print(f"config {config}:\n{cfg.dump()}", flush=True)
        run_training(cfg, out_dir, resume=resume, progress=progress, planner=plan_memory)
    except NmtError as exc:
        raise _fail(exc) from None
    except TrainingInterrupted as exc:
        _err(str(exc))
        raise typer.Exit(code=128 + exc.signum) from None
    except KeyboardInterrupt:
        _err("interrupted (second signal): the last checkpoint written is kept")
        raise typer.Exit(code=130) from None


@app.command()
def translate(
    model: Annotated[
        Path,
        typer.Option(
            "--model",
            "-m",
            help="Checkpoint: a run's model.pt (its best validation score so far) or "
            "last.pt (its latest step, the final model once training ends).",
        ),
    ],
    src: Annotated[
        Path,
        typer.Option(
            help="Source file, one sentence per line (an empty file is an error); '-' reads "
            "stdin and writes each batch's translations as soon as they are done (empty "
            "stdin: no output, exit 0)."
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write translations here (default stdout)."),
    ] = None,
    ref: Annotated[
        Path | None,
        typer.Option(help="Reference file: print sacreBLEU BLEU and chrF to stderr."),
    ] = None,
    beam_size: Annotated[int, typer.Option(help="Beam size (1 = greedy).")] = 5,
    max_length: Annotated[int, typer.Option(help="Longest output in tokens.")] = 250,
    max_length_ratio: Annotated[
        float,
        typer.Option(
            help="Also cap outputs at ceil(RATIO x source tokens), within --max-length (0: off)."
        ),
    ] = 0.0,
    min_length: Annotated[
        int, typer.Option(help="Shortest output in tokens (</s> held back).")
    ] = 0,
    n_best: Annotated[
        int | None,
        typer.Option(
            help="Write the N best distinct hypotheses of each sentence as "
            "'INDEX ||| translation ||| score' lines, best first, INDEX from 0 (N <= beam size)."
        ),
    ] = None,
    length_penalty: Annotated[
        float,
        typer.Option(
            help="GNMT length penalty alpha: rank finished hypotheses by "
            "log P / ((5 + length) / 6) ** alpha (0: off, as seq2seq-attn)."
        ),
    ] = 0.0,
    replace_unk: Annotated[
        bool,
        typer.Option(
            "--replace-unk",
            help="Word vocabularies: replace each output <unk> by the source word with the "
            "highest attention (or its --phrase-table translation).",
        ),
    ] = False,
    phrase_table: Annotated[
        Path | None, typer.Option(help="'source|||target' lines used by --replace-unk.")
    ] = None,
    score_gold: Annotated[
        bool,
        typer.Option(
            "--score-gold",
            help="With --ref: print each reference's log-likelihood and their perplexity.",
        ),
    ] = False,
    attention: Annotated[
        Path | None,
        typer.Option(help="Write each sentence's attention matrix here (JSON lines)."),
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Sentences per batch.")] = 32,
    max_src_length: Annotated[
        int,
        typer.Option(help="Truncate longer sources to this many tokens, with a warning (0: off)."),
    ] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show a progress bar on stderr.")
    ] = True,
) -> None:
    """Translate with beam search and a trained checkpoint."""
    from nmt.translate.run import TranslateOptions, translate_file
    from nmt.translate.search import SearchOptions

    try:
        options = TranslateOptions(
            search=SearchOptions(
                beam_size=beam_size,
                max_length=max_length,
                max_length_ratio=max_length_ratio,
                min_length=min_length,
                n_best=1 if n_best is None else n_best,
                length_penalty=length_penalty,
            ),
            output=output,
            nbest=n_best is not None,
            attention=attention,
            ref=ref,
            score_gold=score_gold,
            replace_unk=replace_unk,
            phrase_table=phrase_table,
            max_src_length=max_src_length,
            batch_size=batch_size,
            device=device,
            progress=progress,
        )
        translate_file(model, src, options)
    except NmtError as exc:
        raise _fail(exc) from None


@app.command()
def average(
    checkpoints: Annotated[
        list[Path],
        typer.Argument(
            help="Checkpoints of one model, e.g. RUN/ckpt_step*.pt (train.keep_checkpoints)."
        ),
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Write the averaged checkpoint here.")
    ],
) -> None:
    """Average the model weights of several checkpoints into one for `nmt translate`."""
    from nmt.train.average import average_files

    try:
        state = average_files(checkpoints, output)
    except NmtError as exc:
        raise _fail(exc) from None
    steps = ", ".join(str(item["step"]) for item in state["averaged"])
    print(f"averaged {len(checkpoints)} checkpoints (steps {steps}) into {output}")


@app.command(
    help=f"Training memory per preallocation policy ({', '.join(policies.names())}) and "
    "plain autograd: the training step, validation and their peak."
)
def memreport(
    config: ConfigOpt,
    set_: SetOpt = None,
    device: Annotated[
        str,
        typer.Option(
            help="meta: exact accounting only; cpu: also a real step per policy, checked; "
            "cuda[:N]: also real peaks per policy; auto: meta unless a CPU step is small."
        ),
    ] = "auto",
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write every number to this JSON file.")
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG (needs matplotlib, the 'plot' extra).")
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            help="A size like 16GiB, 500MB or 2G: the largest batch / length whose peak "
            "(training step, validation, translation if asked) fits."
        ),
    ] = None,
    detail: Annotated[
        str,
        typer.Option(
            help=f"Row of the largest-buffers table: {'|'.join(policies.names())}|autograd"
            "|autograd-full."
        ),
    ] = policies.DEFAULT,
    top: Annotated[int, typer.Option(help="Rows of the largest-buffers table.")] = 15,
    translate: Annotated[
        str | None,
        typer.Option(
            metavar="BEAM[,BATCH]",
            help="Also account a beam search of this beam size and batch size (default 32; "
            "sources at data.max_src_len, outputs up to 250 tokens) as a phase of the run.",
        ),
    ] = None,
) -> None:
    from nmt.config import load_config
    from nmt.memreport import run as run_memreport
    from nmt.memreport.live import out_of_memory_line

    try:
        cfg = load_config(config, list(set_ or []), require_data=False)
        report = run_memreport(
            cfg,
            str(config),
            device=device,
            json_path=json_path,
            plot_path=plot,
            budget=budget,
            detail=detail,
            top=top,
            translate=translate,
        )
    except NmtError as exc:
        raise _fail(exc) from None
    out_of_memory = out_of_memory_line(report.live, report.setting, str(config))
    if out_of_memory:  # a policy does not fit the device: exit 2, as training would
        raise _fail(NmtError(out_of_memory))
    failed = [p for p, r in report.live.items() if not r.ok]
    if failed:  # the accounting disagreed with a real step (or the step ran out of memory)
        _err(f"error: real step check failed for {', '.join(failed)} (see the table above)")
        raise typer.Exit(code=1)


def main() -> None:
    app()
