"""The `nmt` command line. Each command loads its inputs, calls ONE function, prints.

Mistakes a user can fix (NmtError) become one line on stderr and exit code 2.
"""

from __future__ import annotations

import functools
import inspect
import os
import platform
import sys
import time
import typing
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nmt import cli_help, option_names, policies
from nmt.errors import NmtError
from nmt.terminal import shows_bar

if TYPE_CHECKING:
    from nmt.config import Config


class Command(typer.core.TyperCommand):
    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        formatter.write(cli_help.render(self, ctx))

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
    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        formatter.write(cli_help.render(self, ctx))

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """A mistake on the command line (an unknown option, a value of the wrong type, a
        missing option) is one line and exit code 2, as every other mistake is; click's own
        form is a usage block and a box."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        given = kwargs.get("args", args[0] if args else None)  # click's `args`, else argv
        argv = sys.argv[1:] if given is None else list(given)
        if problem := self._single_dash_option(argv):
            _err(f"error: {problem}")
            sys.exit(2)
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
            message = exc.format_message()
            if type(exc).__name__ == "NoSuchOption" and ctx is not None:
                message = _meant_option(exc.option_name, ctx, argv) or message
            _err(f"error: {message}{see}")
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)

    def _single_dash_option(self, argv: list[str]) -> str | None:
        """`nmt translate -model M`: one of the command's options with one dash, which click
        would take for `-m odel` (`option_names.single_dash`); None: none such."""
        name = next((a for a in argv if not a.startswith("-")), None)
        command = self.commands.get(name) if name else None
        if command is None:
            return None
        flags = option_names.flags_of(command)
        problem = option_names.single_dash(argv[argv.index(name) + 1 :], flags)
        return f"{problem} (see 'nmt {name} --help')" if problem else None


def _meant_option(option_name: str, ctx: typer.Context, argv: list[str]) -> str | None:
    """An unknown option in another tool's spelling, answered with ours (`option_names`)."""
    flags = option_names.flags_of(ctx.command)
    token = option_names.typed(option_name, argv)
    meant = option_names.meant(token, flags, takes_set="--set" in flags)
    return meant or (f"No such option: {token}" if token != option_name else None)


app = typer.Typer(
    cls=Group,
    add_completion=False,  # not offered: typer's installer speaks in its own form of errors
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train and run LSTM-attention translation models the seq2seq-attn way.",
)
command = partial(app.command, cls=Command)


def version_line() -> str:
    """nmt's version and torch's (read from its metadata: importing torch takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    from nmt import __version__

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    return f"nmt {__version__} (torch {torch_version}, Python {platform.python_version()})"


def _print_version(value: bool) -> None:
    if value:
        print(version_line())
        raise typer.Exit()


@app.callback()
def options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print the versions of nmt, torch and Python, and exit.",
        ),
    ] = False,
) -> None:
    """Options of `nmt` itself, before the command."""


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _fail(exc: NmtError) -> typer.Exit:
    _err(f"error: {exc}")
    return typer.Exit(code=2)


def set_option(panel: str) -> Any:
    """`--set KEY=VALUE`, as train, config and memreport take it."""
    return typer.Option(
        "--set",
        "-s",
        metavar="KEY=VALUE",
        rich_help_panel=panel,
        help="Override a config key: section.key=value (repeatable).",
    )


def _train_command(
    config: Path | None, sets: list[str], preallocate: bool | None, nproc_per_node: int = 1
) -> list[str]:
    """The `nmt train` options that gave this run its config: what a resume hint repeats;
    under torchrun, as torchrun starts it (its rendezvous options for several machines are
    not known here: the hint names the node count only)."""
    command = ["nmt", "train"]
    world, local = int(os.environ.get("WORLD_SIZE", "1")), os.environ.get("LOCAL_WORLD_SIZE")
    if nproc_per_node > 1:
        command += ["--nproc-per-node", str(nproc_per_node)]
    elif world > 1:
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
            rich_help_panel=cli_help.RUN_CONFIG,
            help="YAML config file; with --resume it may be left out: the checkpoint's own "
            "config is used.",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            rich_help_panel=cli_help.RUN_DIRECTORY,
            help="Run directory (default: the --resume file's, else runs/<config name>).",
        ),
    ] = None,
    set_: Annotated[list[str] | None, set_option(cli_help.RUN_CONFIG)] = None,
    preallocate: Annotated[
        bool | None,
        typer.Option(
            "--preallocate/--no-preallocate",
            rich_help_panel=cli_help.MEMORY,
            help=f"--preallocate: the config's train.prealloc policy, or '{policies.DEFAULT}' "
            f"when it says '{policies.OFF}'; --no-preallocate: '{policies.OFF}'. Policies: "
            f"{policies.describe()}.",
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            metavar="CKPT",
            rich_help_panel=cli_help.RUN_DIRECTORY,
            help="Continue from this last.pt.",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            rich_help_panel=cli_help.RUN_DIRECTORY,
            help="Overwrite a run directory that holds a run.",
        ),
    ] = False,
    nproc_per_node: Annotated[
        int,
        typer.Option(
            "--nproc-per-node",
            min=1,
            metavar="N",
            rich_help_panel=cli_help.DEVICE,
            help="Train data-parallel as N ranks on this machine (each GPU its own rank, or "
            "CPU ranks on Gloo), as torchrun --nproc_per_node N would start them, but forked "
            "from this process: the ranks share its imported torch and the corpus's pages.",
        ),
    ] = 1,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            rich_help_panel=cli_help.OUTPUT,
            help="Show a progress bar on stderr; without either flag, only when stderr is a "
            "terminal (the steps' lines are printed otherwise).",
        ),
    ] = None,
) -> None:
    """Train a model; checkpoints go to OUT/last.pt (the latest) and OUT/model.pt (the best
    validation by train.early_stopping_metric)."""
    # what a rank runs is imported before the config is read: the command's first seconds
    # (a Ctrl-C there is one line), and forked ranks share it
    from nmt.checkpoint import saved_config
    from nmt.config import load_config
    from nmt.memreport.plan import plan_memory
    from nmt.train import local_ranks
    from nmt.train.distributed import launched_by_torchrun
    from nmt.train.trainer import train as run_training

    sets = list(set_ or [])
    try:
        if config is None and resume is None:
            raise NmtError(
                "--config is required (or --resume CKPT: continue a run with the config "
                "saved in its checkpoint)"
            )
        if nproc_per_node > 1 and launched_by_torchrun() and not local_ranks.started_here():
            raise NmtError(
                "--nproc-per-node: torchrun starts this command's ranks; leave one of them out"
            )
        cfg = load_config(config, sets) if config is not None else saved_config(resume, sets)
        cfg.train.prealloc = policies.with_flag(cfg.train.prealloc, preallocate)
    except NmtError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        _err("interrupted: no checkpoint")
        raise typer.Exit(code=130) from None
    command = _train_command(config, sets, preallocate, nproc_per_node)
    source = str(config) if config is not None else f"saved in {resume}"
    # a resumed run continues in its own directory unless told otherwise
    out_dir = out or (resume.parent if resume else Path("runs") / config.stem)

    def run_rank() -> int:
        try:
            run = partial(run_training, planner=plan_memory, command=command)
            _train_rank(cfg, source, out_dir, resume, force, shows_bar(progress), run)
        except typer.Exit as stop:
            return stop.exit_code
        return 0

    if nproc_per_node > 1 and not local_ranks.started_here():
        code = local_ranks.run_ranks(nproc_per_node, run_rank, _err)
    else:
        code = run_rank()
    if code:
        raise typer.Exit(code=code)


def _train_rank(
    cfg: Config,
    source: str,
    out_dir: Path,
    resume: Path | None,
    force: bool,
    progress: bool,
    run_training: Callable[..., Any],
) -> None:
    """One rank's `nmt train` (every rank under torchrun): the run directory, the training
    (`run_training(cfg, out_dir, resume=, progress=)`), and what a failure or an
    interruption says and leaves."""
    from nmt.train.runlog import log_failure, prepare_run_dir, remove_if_empty
    from nmt.train.trainer import TrainingInterrupted

    made: list[Path] = []
    started = time.time()
    speaks = os.environ.get("RANK", "0") == "0"  # with several ranks, rank 0 speaks and logs
    try:
        made = prepare_run_dir(out_dir, resume=resume, force=force)
        if speaks:
            print(f"config {source}:\n{cfg.dump()}", flush=True)
        run_training(cfg, out_dir, resume=resume, progress=progress)
        made = []
    except NmtError as exc:
        if speaks:
            log_failure(out_dir, started, f"error: {exc}")  # the run's log says why it ended
        raise _fail(exc) from None
    except TrainingInterrupted as exc:
        if speaks:  # every rank stopped at the same step; rank 0 saved it
            _err(str(exc))
        raise typer.Exit(code=128 + exc.signum) from None
    except KeyboardInterrupt:  # before training began, or a second Ctrl-C during it
        last = out_dir / "last.pt"
        kept = f"{last} is kept" if last.is_file() else "no checkpoint"
        message = f"interrupted: {kept}"
        if speaks:
            log_failure(out_dir, started, message)
        _err(message)
        raise typer.Exit(code=130) from None
    finally:
        remove_if_empty(made)  # a failed run leaves no empty directory behind


@command(name="config")
def config_(
    path: Annotated[
        Path | None,
        typer.Argument(
            metavar="[PATH]",
            help="A run directory (its config.yaml, else last.pt, else model.pt), a checkpoint "
            "or a YAML config; left out: the defaults.",
        ),
    ] = None,
    set_: Annotated[list[str] | None, set_option(cli_help.RUN_CONFIG)] = None,
) -> None:
    """Print a config as YAML, each key under its one-line doc: the defaults, or the
    resolved config of a run, a checkpoint or a config file. What it prints is a config file:
    save it, edit it, train with it."""
    from nmt.checkpoint import config_of
    from nmt.config import build_config, commented_yaml

    sets = list(set_ or [])
    try:
        if path is None:
            cfg = build_config({}, "the defaults", sets, require_data=False)
            header = ["the default config (nmt config); data.* must be given to train"]
        else:
            cfg = config_of(path, sets)
            header = [f"the config of {path} (nmt config {path})"]
    except NmtError as exc:
        raise _fail(exc) from None
    header += [f"--set {text}" for text in sets]
    print(commented_yaml(cfg, header), end="")


def with_decoding_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with one option for each field of `SearchOptions` (its flag, type and help
    from the field, `nmt.translate.options`), all defaulting to None (not given); it is
    called with them as one dict, `decoding`. A new decoding option is a field there."""
    from nmt.translate import options

    hints = typing.get_type_hints(command, include_extras=True)
    own = [
        p.replace(annotation=hints[p.name])
        for p in inspect.signature(command).parameters.values()
        if p.name != "decoding"
    ]
    added = []
    for f in options.fields():
        typ = options.types()[f.name]
        name = options.flag(f.name)
        declared = f"{name}/--no-{name[2:]}" if typ is bool else name
        option = typer.Option(
            declared,
            help=options.help_text(f),
            show_default=False,
            rich_help_panel=cli_help.DECODING,
        )
        annotation = Annotated[typ | None, option]  # type: ignore[valid-type]
        kind = inspect.Parameter.KEYWORD_ONLY
        added.append(inspect.Parameter(f.name, kind, default=None, annotation=annotation))
    names = [p.name for p in added]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        decoding = {name: kwargs.pop(name) for name in names}
        return command(**kwargs, decoding=decoding)

    at = next(i for i, p in enumerate(own) if p.name == "ref") + 1  # after --ref in --help
    params = [*own[:at], *added, *own[at:]]
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


@command()
def prepare(
    config: Annotated[
        Path,
        typer.Option(
            "--config", "-c", rich_help_panel=cli_help.RUN_CONFIG, help="YAML config file."
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            rich_help_panel=cli_help.RUN_DIRECTORY,
            help="Run directory (default: runs/<config name>).",
        ),
    ] = None,
    set_: Annotated[list[str] | None, set_option(cli_help.RUN_CONFIG)] = None,
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


@command()
@with_decoding_options
def translate(
    model: Annotated[
        list[Path],
        typer.Option(
            "--model",
            "-m",
            metavar="CKPT",
            rich_help_panel=cli_help.INPUT,
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
            rich_help_panel=cli_help.INPUT,
            help="Source file, one sentence per line (an empty file is an error); '-' reads "
            "stdin and writes each batch's translations as soon as they are done (from a "
            "terminal: each line; empty stdin: no output, exit 0).",
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            rich_help_panel=cli_help.OUTPUT,
            help="Write translations here (default or -: stdout).",
        ),
    ] = None,
    ref: Annotated[
        Path | None,
        typer.Option(
            rich_help_panel=cli_help.INPUT,
            help="Reference file: print sacreBLEU BLEU and chrF to stderr.",
        ),
    ] = None,
    phrase_table: Annotated[
        Path | None,
        typer.Option(
            rich_help_panel=cli_help.DECODING, help="'source|||target' lines used by --replace-unk."
        ),
    ] = None,
    score_gold: Annotated[
        bool,
        typer.Option(
            "--score-gold",
            rich_help_panel=cli_help.OUTPUT,
            help="With --ref: print each reference's log-likelihood and their perplexity.",
        ),
    ] = False,
    attention: Annotated[
        Path | None,
        typer.Option(
            rich_help_panel=cli_help.OUTPUT,
            help="Write each sentence's attention matrix here (JSON lines).",
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option(rich_help_panel=cli_help.INPUT, help="Sentences per batch.")
    ] = 32,
    max_src_length: Annotated[
        int,
        typer.Option(
            rich_help_panel=cli_help.INPUT,
            help="Truncate longer sources to this many tokens, with a warning (0: off).",
        ),
    ] = 0,
    device: Annotated[
        str, typer.Option(rich_help_panel=cli_help.DEVICE, help="auto, cpu, cuda or cuda:N.")
    ] = "auto",
    precision: Annotated[
        str | None,
        typer.Option(
            rich_help_panel=cli_help.DEVICE,
            help="The weights' dtype: float32, bfloat16, float16 or float64 (default: the "
            "precision the model was trained in, or float32 where the device has no units "
            "for it). Scores stay float32, the log-softmax float32 at least.",
        ),
    ] = None,
    quantize: Annotated[
        str,
        typer.Option(
            rich_help_panel=cli_help.DEVICE,
            help="none, or int8: the output layer's and the LSTM gates' products from 8-bit "
            "weights on the CPU - beam search 1.4-2.4x faster than float32 (a Xeon, a Zen 4), "
            "translations may differ slightly (docs/speed.md). Where it cannot run, one line "
            "says why and the model's own products run.",
        ),
    ] = "none",
    cuda_graphs: Annotated[
        str,
        typer.Option(
            rich_help_panel=cli_help.DEVICE,
            help="Replay each batch's search steps as CUDA graphs: auto (where the device is "
            "CUDA), on or off. The same translations; what cannot replay (sampling, where "
            "this torch's graphs cannot draw from its generator) runs eager, with one line.",
        ),
    ] = "auto",
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            rich_help_panel=cli_help.OUTPUT,
            help="Show a progress bar on stderr, and before it the decoding options, threads "
            "and precision used; without either flag, the bar only when stderr is a terminal.",
        ),
    ] = None,
    decoding: dict[str, Any] | None = None,
) -> None:
    """Translate with beam search and a trained checkpoint (or an ensemble of several). The
    decoding options left out come from the (first) checkpoint's translate: section; one
    line on stderr (with the progress bar) says which values were used and where each came from."""
    from nmt.translate import decoding as model_decoding
    from nmt.translate.run import STDIN, TranslateOptions, translate_file
    from nmt.translate.search import SearchOptions

    decoding = decoding or {}  # the options of `with_decoding_options`, None: not given
    given = {key: value for key, value in decoding.items() if value is not None}
    try:
        options = TranslateOptions(
            search=SearchOptions(**given),  # the model's values replace its defaults later
            output=None if str(output) == STDIN else output,  # `-o -`: stdout, as --src -
            nbest="n_best" in given,
            attention=attention,
            ref=ref,
            score_gold=score_gold,
            phrase_table=phrase_table,
            max_src_length=max_src_length,
            batch_size=batch_size,
            device=device,
            precision=precision,
            quantize=quantize,
            cuda_graphs=cuda_graphs,
            progress=progress,
            from_model=model_decoding.not_given(decoding),
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
        Path,
        typer.Option(
            "--output",
            "-o",
            rich_help_panel=cli_help.OUTPUT,
            help="Write the averaged checkpoint here.",
        ),
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
    "plain autograd: the training step, validation and their peak. First the bottom line for "
    "the config given (its plan, its peak and in which phase, what none and recompute would "
    "cost, whether it fits the device or --budget), then the tables."
)
def memreport(
    config: Annotated[
        Path,
        typer.Option(
            "--config", "-c", rich_help_panel=cli_help.RUN_CONFIG, help="YAML config file."
        ),
    ],
    set_: Annotated[list[str] | None, set_option(cli_help.RUN_CONFIG)] = None,
    device: Annotated[
        str,
        typer.Option(
            metavar="DEVICE",
            rich_help_panel=cli_help.ACCOUNTING,
            help="meta: exact accounting only (with train.device's kernel forms); cpu: "
            "also a real step per policy, checked; "
            "cuda[:N]: also real peaks per policy; auto: meta unless a CPU step is small.",
        ),
    ] = "auto",
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json", rich_help_panel=cli_help.OUTPUT, help="Write every number to this JSON file."
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            rich_help_panel=cli_help.OUTPUT,
            help="Write a PNG (needs matplotlib, the 'plot' extra).",
        ),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE",
            rich_help_panel=cli_help.ACCOUNTING,
            help="A size like 16GiB, 500MB or 2G: the largest batch / length whose peak "
            "(training step, validation, translation if asked) fits.",
        ),
    ] = None,
    detail: Annotated[
        str,
        typer.Option(
            metavar="ROW",
            rich_help_panel=cli_help.OUTPUT,
            help=f"Row of the largest-buffers table: {'|'.join(policies.names())}|autograd"
            "|autograd-full; or seed: that of 'all', and the seed's PR #45 arithmetic, which a "
            "config on the seed's graph (model.granularity nngraph) shows anyway.",
        ),
    ] = policies.DEFAULT,
    top: Annotated[
        int,
        typer.Option(rich_help_panel=cli_help.OUTPUT, help="Rows of the largest-buffers table."),
    ] = 15,
    translate: Annotated[
        str | None,
        typer.Option(
            metavar="BEAM[,BATCH]",
            rich_help_panel=cli_help.ACCOUNTING,
            help="Also account a beam search of this beam size and batch size (default 32; "
            "sources at data.max_src_len, outputs up to 250 tokens) as a phase of the run.",
        ),
    ] = None,
    precision: Annotated[
        str | None,
        typer.Option(
            metavar="P[,P...]",
            rich_help_panel=cli_help.ACCOUNTING,
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
