"""`train` command line (also `python -m mspretrain.train`).

  train launch   --config F.yaml [--set k=v ...] [--resume auto|CKPT_DIR] [--force]
                 [--nproc N [--nnodes K --node-rank R --master-addr A --master-port P]]
  train eval     --config F.yaml [--set k=v ...] [--checkpoint DIR]
  train eval     RUN --tasks F.jsonl [...] [--step N | --all-checkpoints] [--few-shot K --seed S]
  train compare  RUN_A RUN_B [--plot FILE.png]   exit 0 only if every common step's loss is bitwise equal
  train plot     RUN [RUN ...] --out FILE.png   loss, val loss, lr, grad norm, loss scale, tokens/s
                 [--config F.yaml --set ...]   also the configured lr schedule (runs optional then)
  train plan     --config F.yaml [--set ...] [--world-size N]          the parallel plan (train.parallel.apply)
  train doctor   --config F.yaml --set data.path=DIR [--nproc N]       ladder of three-step runs (train.doctor)
  train estimate --config F.yaml [--device-memory 64GB] [--seq-length N] [--margin 10%]
                 memory and modelled step time per device, the fastest layout that fits (train.memory)
                 (without data.path: --seq-length N and --set model.vocab_size=V give the shapes)
  train export   RUN [--step N] --format hf --out DIR [--dtype fp32|bf16|fp16]   Hugging Face Llama
  train import   --from HF_DIR --config F.yaml --set run.dir=RUN            step 0 of a new run
  train generate RUN --prompt TEXT | --prompts F.jsonl [--max-new-tokens --temperature --top-p --seed]
  train score    RUN --input F.jsonl --out F.jsonl       per-token log-probabilities, perplexity
Every module is imported lazily: `train compare` and `--help` never import MindSpore; nothing but
`hold_ctrl_c` at module level, so that `main` holds a Ctrl-C from its first line (mspretrain.common.console).
Exit codes (mspretrain.common.console): 0 done, 1 a runtime error (a damaged checkpoint, run or dataset,
a full disk, a locked run: one line naming the file), 2 a usage error (a flag, a config key or value),
130 Ctrl-C.
"""
from __future__ import annotations

import sys

from mspretrain import hold_ctrl_c     # the package's root: loaded already


def _config_args(p) -> None:
    from mspretrain.common.config import add_config_options
    add_config_options(p, required=True)


def parser():
    import argparse

    from mspretrain.common.config import add_config_options
    ap = argparse.ArgumentParser(prog="train", description="Llama-style pretraining on MindSpore")
    sub = ap.add_subparsers(dest="command", required=True)

    # no abbreviations: `--npr 2` is an error, not a second spelling of a launcher flag
    p = sub.add_parser("launch", help="train (one process, or --nproc N under msrun)", allow_abbrev=False)
    _config_args(p)
    p.add_argument("--resume", metavar="auto|CKPT_DIR",
                   help="continue from RUN/checkpoints/latest (auto) or from a checkpoint directory")
    p.add_argument("--force", action="store_true",
                   help="resume even if the config hash or dataset fingerprint differ")
    p.add_argument("--verify-data", action="store_true",
                   help="check every shard's sha256 against the manifest before training")
    p.add_argument("--nproc", type=int, default=1, help="processes on this node (msrun when > 1)")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default=None)
    p.add_argument("--master-port", type=int, default=None)
    p.add_argument("--hang-timeout", type=float, default=None,
                   help="seconds of silent worker logs before an msrun job is stopped as hung")
    p.add_argument("--cluster-timeout", type=int, default=None, help="msrun --cluster_time_out")

    p = sub.add_parser("eval", help="validation loss and perplexity of a checkpoint; or RUN --tasks")
    add_config_options(p, required=False)     # required unless RUN --tasks
    p.add_argument("--checkpoint", help="checkpoint directory (default: RUN/checkpoints/latest)")
    p.add_argument("--verify-data", action="store_true",
                   help="check every shard's sha256 against the manifest first")
    p.add_argument("run", nargs="?", help="run dir (with --tasks)")
    p.add_argument("--tasks", nargs="+", metavar="F.jsonl",
                   help='multiple-choice tasks: {"context", "choices", "gold"} lines (train.eval.tasks)')
    p.add_argument("--step", type=int, default=None, help="with --tasks: checkpoint step (default: latest)")
    p.add_argument("--all-checkpoints", action="store_true", help="with --tasks: every checkpoint, a table")
    p.add_argument("--few-shot", type=int, default=0, help="with --tasks: examples before each item")
    p.add_argument("--seed", type=int, default=1234, help="with --tasks: seed of the few-shot draw")
    p.add_argument("--batch-size", type=int, default=None,
                   help="with --tasks: rows per forward (default: the run's eval.batch_size)")

    p = sub.add_parser("compare", help="are two runs' losses bitwise equal, step by step?")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--plot", metavar="FILE.png", help="also draw both runs' curves into FILE.png")

    p = sub.add_parser("plot", help="draw runs' loss, val loss, lr, grad norm, loss scale, tokens/s")
    p.add_argument("runs", nargs="*", metavar="RUN")
    p.add_argument("--out", required=True, metavar="FILE.png")
    add_config_options(p)      # optional: draw the config's learning-rate schedule too

    p = sub.add_parser("plan", help="print the parallel plan")
    _config_args(p)
    p.add_argument("--world-size", type=int, default=None,
                   help="processes in the job (default: data_parallel x model_parallel x pipeline_stage)")

    p = sub.add_parser("doctor", help="a ladder of three-step runs that checks the parallel setup")
    _config_args(p)
    p.add_argument("--nproc", type=int, default=2, help="processes for the multi-process rungs")
    p.add_argument("--out", default=None, help="work directory (default: RUN/doctor)")

    p = sub.add_parser("estimate", help="estimate memory per device")
    _config_args(p)
    p.add_argument("--device-memory", default="64GB", help="device memory, e.g. 64GB")
    p.add_argument("--seq-length", type=int, default=None,
                   help="tokens per sample (default: the dataset's, from data.path)")
    p.add_argument("--margin", default="10%",
                   help="device memory kept free for workspace, HCCL buffers and fragmentation: "
                        "a share (10%%, 0.1) or a size (4GB); default 10%%")
    _add_hf_commands(sub)
    return ap


def _add_hf_commands(sub) -> None:
    """export / import / generate / score (train.hf.convert, train.eval.generate, train.eval.score)."""
    p = sub.add_parser("export", help="write a checkpoint as a Hugging Face Llama directory")
    p.add_argument("run", help="run dir")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--format", choices=["hf"], default="hf")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")

    p = sub.add_parser("import", help="start a run (step 0) from a Hugging Face Llama checkpoint")
    p.add_argument("--from", dest="hf_dir", required=True, help="Hugging Face model directory")
    _config_args(p)

    p = sub.add_parser("generate", help="greedy or sampled generation from a checkpoint")
    p.add_argument("run", help="run dir")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt text")
    src.add_argument("--prompts", help='jsonl file of {"text": ...} or {"tokens": [ids]} lines')
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", default=None, help="jsonl output (default: stdout)")

    p = sub.add_parser("score", help="per-token log-probabilities and perplexity of documents")
    p.add_argument("run", help="run dir")
    p.add_argument("--input", required=True, help='jsonl of {"text": ...} or {"tokens": [ids]} lines')
    p.add_argument("--out", required=True, help="jsonl output, one line per input line")
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=8)


def _run_hf_command(args) -> int | None:
    if args.command == "export":
        from mspretrain.train.hf.convert import export_run
        export_run(args.run, args.out, args.step, args.dtype)
        return 0
    if args.command == "generate":
        from mspretrain.train.eval.generate import Sampling, main as generate
        return generate(args.run, args.prompt, args.prompts,
                        Sampling(args.max_new_tokens, args.temperature, args.top_p, args.seed),
                        step=args.step, out=args.out, batch_size=args.batch_size)
    if args.command == "score":
        from mspretrain.train.eval.score import main as score
        return score(args.run, args.input, args.out, args.step, args.batch_size)
    return None


def _run_tasks(args) -> int:
    from mspretrain.common.console import UsageError
    if not (args.tasks and args.run):
        raise UsageError("give both RUN and --tasks F.jsonl (or --config F.yaml for the validation loss)")
    if args.all_checkpoints and args.step is not None:
        raise UsageError("--step and --all-checkpoints exclude each other")
    from mspretrain.train.eval.suite import task_batch_size
    from mspretrain.train.eval.tasks import main as tasks
    batch = args.batch_size or task_batch_size(args.run)
    return tasks(args.run, args.tasks, args.step, args.all_checkpoints, args.few_shot, args.seed, batch)


def main(argv: list[str] | None = None) -> int:
    """The `train` command; argv None: the process's own command line (a console script)."""
    held = hold_ctrl_c()      # first: a Ctrl-C from here on ends the command with one line
    from mspretrain.common import console
    own = argv is None
    argv = list(sys.argv[1:] if own else argv)
    parsed: list = []

    def load():
        import importlib
        args = parser().parse_args(argv)
        parsed.append(args)
        for module in ("mspretrain.common.config", "mspretrain.train.config",
                       *_MODULES.get(_command_key(args), ())):
            importlib.import_module(module)
        return lambda: _run(args, argv)

    def interrupted() -> str:
        return f"train {parsed[0].command}: interrupted" if parsed else "train: interrupted"

    return console.run("train", load, exiting=own, interrupted=interrupted, held=held)


# the modules each command imports (main imports them first, while a Ctrl-C is only remembered:
# a KeyboardInterrupt inside MindSpore's or matplotlib's import leaves it half-imported)
_MODULES = {
    "launch": ("mspretrain.train.trainer", "mspretrain.train.console"),
    "launch-msrun": ("mspretrain.train.launch", "mspretrain.train.console"),
    "eval": ("mspretrain.train.eval.evaluate",),
    "eval-tasks": ("mspretrain.train.eval.suite", "mspretrain.train.eval.tasks"),
    "compare": ("mspretrain.train.observe.metrics", "mspretrain.train.observe.plot"),
    "compare-plot": ("mspretrain.train.observe.metrics", "mspretrain.train.observe.plot", "matplotlib.pyplot"),
    "plot": ("mspretrain.train.observe.plot", "matplotlib.pyplot"),
    "plan": ("mspretrain.train.parallel.plan",),
    "doctor": ("mspretrain.train.doctor",),
    "estimate": ("mspretrain.train.layouts",),
    "export": ("mspretrain.train.hf.convert",),
    "import": ("mspretrain.train.hf.convert",),
    "generate": ("mspretrain.train.eval.generate",),
    "score": ("mspretrain.train.eval.score",),
}


def _command_key(args) -> str:
    if args.command == "launch" and (args.nproc > 1 or args.nnodes > 1):
        return "launch-msrun"
    if args.command == "eval" and (args.tasks or args.run):
        return "eval-tasks"
    if args.command == "compare" and args.plot:
        return "compare-plot"
    return args.command


def _run(args, argv: list[str]) -> int:
    """The command, with its errors classified: a usage error exits 2, a runtime error 1, each one
    line; anything else is a bug and keeps its traceback."""
    from mspretrain.common.config import report
    from mspretrain.common.console import FAILED, UsageError, runtime_error_line
    from mspretrain.common.errors import MspretrainError
    try:
        return _dispatch(args, argv)
    except UsageError as e:    # ConfigError included
        return report(f"train {args.command}", e)
    except KeyboardInterrupt:
        if args.command != "launch":
            raise               # console.run says "train COMMAND: interrupted"
        from mspretrain.train.console import interrupted
        return interrupted(args, argv)
    except (MspretrainError, OSError) as e:
        print(f"train {args.command}: {runtime_error_line(e)}", file=sys.stderr)
        return FAILED


def _dispatch(args, argv: list[str]) -> int:
    from mspretrain.train.config import load_config
    if args.command == "compare":
        from mspretrain.train.observe.metrics import compare_runs
        from mspretrain.train.observe.plot import run_records
        run_records(args.run_a), run_records(args.run_b)     # a missing run: a clear error
        code = compare_runs(args.run_a, args.run_b)
        if args.plot:
            from mspretrain.train.observe.plot import plot_runs
            print(f"plot: {plot_runs([args.run_a, args.run_b], args.plot)}")
        return code
    if args.command in ("export", "generate", "score"):
        return _run_hf_command(args)
    if args.command == "eval" and (args.tasks or args.run):
        return _run_tasks(args)
    if args.command == "eval" and not args.config:
        from mspretrain.common.console import UsageError
        raise UsageError("--config F.yaml is required (or: train eval RUN --tasks F.jsonl)")
    if args.command == "plot":
        from mspretrain.train.observe.plot import plot_runs
        schedule = load_config(args.config, args.set) if args.config or args.set else None
        print(f"plot: {plot_runs(args.runs, args.out, schedule)}")
        return 0
    if args.command == "launch" and (args.nproc > 1 or args.nnodes > 1):
        from mspretrain.train.launch import run_msrun
        return run_msrun(args)
    cfg = load_config(args.config, args.set)
    if args.command == "import":
        from mspretrain.train.hf.convert import import_run
        import_run(cfg, args.hf_dir)
        return 0
    if args.command == "launch":
        from mspretrain.train.trainer import launch
        return launch(cfg, resume=args.resume, force=args.force, verify_data=args.verify_data)
    if args.command == "eval":
        from mspretrain.train.eval.evaluate import main as evaluate
        return evaluate(cfg, args.checkpoint, verify_data=args.verify_data)
    if args.command == "doctor":
        from mspretrain.train.doctor import main as doctor
        return doctor(cfg, args.config, args.set, args.nproc, args.out)
    if args.command == "plan":
        from mspretrain.train.parallel.plan import print_plan
        print_plan(cfg, args.world_size)
        return 0
    from mspretrain.train.layouts import main as estimate
    return estimate(cfg, args.device_memory, seq_length=args.seq_length, margin=args.margin) or 0


if __name__ == "__main__":
    sys.exit(main())
