"""Entry point that runs Megatron's pretrain_gpt.py with warm-up instrumentation.

    torchrun ... -m planner.instrument.megatron_wrapper --iters 5 --out instr/ \\
        pretrain_gpt.py <the usual flags>

It wraps `megatron.training.training.train_step`: on the first call it hooks the routers of the
model it is given; each call is one iteration (timed, with the forward-backward function timed
separately); after `--skip` warm-up and `--iters` recorded iterations every rank writes its files
to `--out` and the original train_step is put back, so training continues unchanged (or stops
with `--stop`).  See planner/instrument/README.md.
"""

from __future__ import annotations

import argparse
import functools
import runpy
import sys
from pathlib import Path
from typing import Any, Callable

from planner.instrument.hooks import InstrumentSession, iter_model_chunks


class StopAfterInstrumentation(SystemExit):
    """Raised with --stop once the files are written."""


def _timed_forward_backward(session: InstrumentSession, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with session.phase("forward_backward"):
            return fn(*args, **kwargs)

    return wrapper


def wrap_train_step(train_step: Callable[..., Any], session: InstrumentSession, stop: bool,
                    restore: Callable[[], None]) -> Callable[..., Any]:
    """A train_step that records one iteration per call and restores the original when done."""

    @functools.wraps(train_step)
    def instrumented(*args: Any, **kwargs: Any) -> Any:
        if session.finished:  # a caller that kept a reference to the wrapper
            return train_step(*args, **kwargs)
        if session.router is None:
            model = kwargs.get("model", iter_model_chunks(args))
            if model is not None:
                session.attach(model)
        args = tuple(
            _timed_forward_backward(session, a)
            if callable(a) and getattr(a, "__name__", "").startswith("forward_backward") else a
            for a in args
        )
        if callable(kwargs.get("forward_backward_func")):
            kwargs["forward_backward_func"] = _timed_forward_backward(session, kwargs["forward_backward_func"])
        session.begin_iteration()
        out = train_step(*args, **kwargs)
        if session.end_iteration():
            restore()
            if stop:
                raise StopAfterInstrumentation(0)
        return out

    return instrumented


def install(session: InstrumentSession, stop: bool = False) -> None:
    """Patch Megatron's train_step (megatron.training.training must be importable)."""
    import megatron.training.training as training  # noqa: PLC0415 - Megatron is the user's

    original = training.train_step

    def restore() -> None:
        training.train_step = original

    training.train_step = wrap_train_step(original, session, stop, restore)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m planner.instrument.megatron_wrapper",
        description="Run pretrain_gpt.py and record N warm-up iterations for `cli.py calibrate`.",
    )
    parser.add_argument("--iters", type=int, default=5, help="iterations to record (default 5)")
    parser.add_argument("--skip", type=int, default=1, help="warm-up iterations not recorded (default 1)")
    parser.add_argument("--out", required=True, help="directory for router_stats_rank*.csv, instrument_rank*.json")
    parser.add_argument("--stop", action="store_true", help="exit once the files are written")
    parser.add_argument("script", help="Megatron's training script, e.g. pretrain_gpt.py")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its flags, unchanged")
    ns = parser.parse_args(argv)
    if ns.iters <= 0 or ns.skip < 0:
        parser.error("--iters must be positive and --skip >= 0")
    script = Path(ns.script)
    if not script.is_file():
        parser.error(f"training script not found: {script}")
    session = InstrumentSession(out_dir=Path(ns.out), iters=ns.iters, skip=ns.skip)
    sys.path.insert(0, str(script.resolve().parent))
    try:
        install(session, stop=ns.stop)
    except ImportError as exc:
        print(f"error: cannot import megatron.training.training ({exc}); run from a Megatron-LM checkout "
              "or install megatron-core", file=sys.stderr)
        return 2
    sys.argv = [str(script), *ns.script_args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except StopAfterInstrumentation:
        pass
    if not session.finished:
        print(f"warning: only {len(session.records)} of {ns.iters} iterations were recorded; "
              "writing what there is", file=sys.stderr)
        session.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
