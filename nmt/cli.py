"""The `nmt` command line. Each command loads its inputs, calls ONE function, prints.

Mistakes a user can fix (NmtError) become one line on stderr and exit code 2.
"""

from __future__ import annotations

import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from nmt import policies
from nmt.errors import NmtError


def _no_flag_values(params: list) -> list:
    """On/off flags show no value type in --help: typer gives every boolean option, --help
    included, a `<bool>` column, which reads as if the flag took a value."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Command(typer.core.TyperCommand):
    def get_params(self, ctx: typer.Context) -> list:
        return _no_flag_values(super().get_params(ctx))

    def invoke(self, ctx: typer.Context) -> Any:
        """A Ctrl-C before the command's own handler is in place (its imports: torch takes
        seconds) is one line and exit code 130, as one after it is; typer's own handling
        exits 130 without a word."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            _err("interrupted")
            raise typer.Exit(code=130) from None


class Group(typer.core.TyperGroup):
    def get_params(self, ctx: typer.Context) -> list:
        return _no_flag_values(super().get_params(ctx))

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """A mistake on the command line (an unknown option, a value of the wrong type, a
        missing option) is one line and exit code 2, as every other mistake is; click's own
        form is a usage block and a box."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except typer.Abort:
            _err("aborted")
            sys.exit(1)
        except Exception as exc:  # click's errors (typer vendors click in some versions)
            if not hasattr(exc, "format_message") or not hasattr(exc, "exit_code"):
                raise
            if type(exc).__name__ == "NoArgsIsHelpError":  # `nmt`, `nmt train`: the help
                exc.show()
                sys.exit(exc.exit_code)
            ctx = getattr(exc, "ctx", None)  # a usage error knows its command
            see = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            _err(f"error: {exc.format_message()}{see}")
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train and run LSTM-attention translation models the seq2seq-attn way.",
)
command = partial(app.command, cls=Command)


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _fail(exc: NmtError) -> typer.Exit:
    _err(f"error: {exc}")
    return typer.Exit(code=2)


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="KEY=VALUE",
        help="Override a config key: section.key=value (repeatable).",
    ),
]


def _train_command(config: Path | None, sets: list[str], preallocate: bool | None) -> list[str]:
    """The `nmt train` options that gave this run its config: what a resume hint repeats;
    under torchrun, as torchrun starts it (its rendezvous options for several machines are
    not known here: the hint names the node count only)."""
    command = ["nmt", "train"]
    world, local = int(os.environ.get("WORLD_SIZE", "1")), os.environ.get("LOCAL_WORLD_SIZE")
    if world > 1:
        per_node = int(local or world)
        command = ["torchrun", "--nproc_per_node", str(per_node), "-m", *command]
        if world > per_node:
            command[1:1] = ["--nnodes", str(world // per_node)]
    command += ["--config", str(config)] if config is not None else []
    for text in sets:
        command += ["--set", text]
    if preallocate is not None:
        command.append("--preallocate" if preallocate else "--no-preallocate")
    return command


@command()
def train(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="YAML config file; with --resume it may be left out: the checkpoint's own "
            "config is used.",
        ),
    ] = None,
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
    from nmt.checkpoint import saved_config
    from nmt.config import load_config
    from nmt.memreport.plan import plan_memory
    from nmt.train.runlog import log_failure, prepare_run_dir, remove_if_empty
    from nmt.train.trainer import TrainingInterrupted
    from nmt.train.trainer import train as run_training

    made: list[Path] = []
    sets = list(set_ or [])
    started, out_dir = time.time(), None
    speaks = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 speaks and logs
    try:
        if config is None and resume is None:
            raise NmtError(
                "--config is required (or --resume CKPT: continue a run with the config "
                "saved in its checkpoint)"
            )
        cfg = load_config(config, sets) if config is not None else saved_config(resume, sets)
        cfg.train.prealloc = policies.with_flag(cfg.train.prealloc, preallocate)
        # a resumed run continues in its own directory unless told otherwise
        out_dir = out or (resume.parent if resume else Path("runs") / config.stem)
        made = prepare_run_dir(out_dir, resume=resume, force=force)
        if speaks:
            print(f"config {config or f'saved in {resume}'}:\n{cfg.dump()}", flush=True)
        command = _train_command(config, sets, preallocate)
        run_training(
            cfg, out_dir, resume=resume, progress=progress, command=command, planner=plan_memory
        )
        made = []
    except NmtError as exc:
        if out_dir is not None and speaks:
            log_failure(out_dir, started, f"error: {exc}")  # the run's log says why it ended
        raise _fail(exc) from None
    except TrainingInterrupted as exc:
        _err(str(exc))
        raise typer.Exit(code=128 + exc.signum) from None
    except KeyboardInterrupt:  # before training began, or a second Ctrl-C during it
        last = out_dir / "last.pt" if out_dir is not None else None
        kept = f"{last} is kept" if last is not None and last.is_file() else "no checkpoint"
        message = f"interrupted: {kept}"
        if out_dir is not None and speaks:
            log_failure(out_dir, started, message)
        _err(message)
        raise typer.Exit(code=130) from None
    finally:
        remove_if_empty(made)  # a failed run leaves no empty directory behind


@command()
def prepare(
    config: ConfigOpt,
    out: Annotated[
        Path | None, typer.Option(help="Run directory (default: runs/<config name>).")
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Prepare the training corpus of a config ahead of `nmt train` (which otherwise does it
    at its first start): tokenizers learnt, pairs encoded into OUT/prepared."""
    from nmt.config import load_config
    from nmt.data.corpus import load_corpus

    try:
        cfg = load_config(config, list(set_ or []))
        out_dir = out or Path("runs") / config.stem
        if out_dir.exists() and not out_dir.is_dir():
            raise NmtError(f"--out {out_dir}: is a file, not a directory")
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            reason = exc.strerror or exc.__class__.__name__
            raise NmtError(f"--out {out_dir}: cannot create the run directory ({reason})") from None
        load_corpus(cfg.data, out_dir, log=print)
    except NmtError as exc:
        raise _fail(exc) from None
    print(f"prepared: nmt train --config {config} --out {out_dir} starts from it")


MODEL_DEFAULT = "default: the model's translate.{key}, else {default}"


@command()
def translate(
    model: Annotated[
        list[Path],
        typer.Option(
            "--model",
            "-m",
            metavar="CKPT",
            help="Checkpoint: a run's model.pt (its best validation score so far) or "
            "last.pt (its latest step, the final model once training ends). Repeat it to "
            "decode with the ensemble of the models (mean of their output probabilities at "
            "each step; replace-unk and --attention use the mean of their attention); they "
            "must share the source and target vocabularies, and the first one's decoding "
            "options (its translate: section) are the defaults.",
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
        typer.Option("--output", "-o", help="Write translations here (default or -: stdout)."),
    ] = None,
    ref: Annotated[
        Path | None,
        typer.Option(help="Reference file: print sacreBLEU BLEU and chrF to stderr."),
    ] = None,
    beam_size: Annotated[
        int | None,
        typer.Option(
            help="Beam size, 1 = greedy (" + MODEL_DEFAULT.format(key="beam_size", default=5) + ")."
        ),
    ] = None,
    max_length: Annotated[
        int | None,
        typer.Option(
            help="Longest output in tokens ("
            + MODEL_DEFAULT.format(key="max_length", default=250)
            + ")."
        ),
    ] = None,
    max_length_ratio: Annotated[
        float | None,
        typer.Option(
            help="Also cap outputs at ceil(RATIO x source tokens), within --max-length (0: off; "
            + MODEL_DEFAULT.format(key="max_length_ratio", default=0)
            + ")."
        ),
    ] = None,
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
        float | None,
        typer.Option(
            help="GNMT length penalty alpha: rank finished hypotheses by "
            "log P / ((5 + length) / 6) ** alpha (0: off, as seq2seq-attn; "
            + MODEL_DEFAULT.format(key="length_penalty", default=0)
            + ")."
        ),
    ] = None,
    replace_unk: Annotated[
        bool | None,
        typer.Option(
            "--replace-unk/--no-replace-unk",
            help="Word vocabularies: replace each output <unk> by the source word with the "
            "highest attention (or its --phrase-table translation) ("
            + MODEL_DEFAULT.format(key="replace_unk", default="off")
            + ").",
        ),
    ] = None,
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
    precision: Annotated[
        str | None,
        typer.Option(
            help="The weights' dtype: float32, bfloat16, float16 or float64 (default: the "
            "precision the model was trained in, or float32 where the device has no units "
            "for it). Scores stay float32, the log-softmax float32 at least."
        ),
    ] = None,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show a progress bar on stderr.")
    ] = True,
) -> None:
    """Translate with beam search and a trained checkpoint (or an ensemble of several). The
    decoding options left out come from the (first) checkpoint's translate: section; one
    line on stderr (with the progress bar) says which values were used and where each came from."""
    from nmt.config import TranslateConfig
    from nmt.translate import decoding
    from nmt.translate.run import STDIN, TranslateOptions, translate_file
    from nmt.translate.search import SearchOptions

    flags = {
        "beam_size": beam_size,
        "max_length": max_length,
        "max_length_ratio": max_length_ratio,
        "length_penalty": length_penalty,
        "replace_unk": replace_unk,
    }
    values = decoding.from_flags(TranslateConfig(), flags)  # until the checkpoint says
    try:
        options = TranslateOptions(
            search=SearchOptions(
                beam_size=values.beam_size,
                max_length=values.max_length,
                max_length_ratio=values.max_length_ratio,
                min_length=min_length,
                n_best=1 if n_best is None else n_best,
                length_penalty=values.length_penalty,
            ),
            output=None if str(output) == STDIN else output,  # `-o -`: stdout, as --src -
            nbest=n_best is not None,
            attention=attention,
            ref=ref,
            score_gold=score_gold,
            replace_unk=values.replace_unk,
            phrase_table=phrase_table,
            max_src_length=max_src_length,
            batch_size=batch_size,
            device=device,
            precision=precision,
            progress=progress,
            from_model=decoding.not_given(flags),
        )
        translate_file(list(model), src, options)
    except NmtError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        _err("interrupted" + (f": nothing written to {output}" if output is not None else ""))
        raise typer.Exit(code=130) from None


@command()
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
    from nmt.train.average import average_files, other_runs_warning

    try:
        state = average_files(checkpoints, output)
    except NmtError as exc:
        raise _fail(exc) from None
    if warning := other_runs_warning(state["averaged"]):
        _err(warning)
    steps = ", ".join(str(item["step"]) for item in state["averaged"])
    print(f"averaged {len(checkpoints)} checkpoints (steps {steps}) into {output}")


@command(
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
    precision: Annotated[
        str | None,
        typer.Option(
            metavar="P[,P...]",
            help="Account in this train.precision (float32, bfloat16, float16, float64); "
            "several, comma-separated: the first as the report, the others side by side.",
        ),
    ] = None,
) -> None:
    from nmt.config import load_config
    from nmt.memreport import run as run_memreport
    from nmt.memreport.live import out_of_memory_line

    try:
        names = [p.strip() for p in precision.split(",")] if precision else []
        sets = list(set_ or []) + ([f"train.precision={names[0]}"] if names else [])
        cfg = load_config(config, sets, require_data=False)
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
            compare=tuple(names[1:]),
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
