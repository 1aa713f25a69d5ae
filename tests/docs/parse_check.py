"""Parse commands with their real parsers, run nothing: ``python parse_check.py`` reads a JSON
list of argv lists on stdin and prints a JSON list of answers, one per command: null where
the parser accepted it, else what it said. Runs in a process of its own, since a bench script
may put its own folder on ``sys.path``.

The parsers: ``solaris`` (its argparse tree), ``python SCRIPT.py`` (the script's own argparse,
stopped once it has parsed), ``python -c`` (compiled), ``serve`` and ``ray`` (Ray's click
groups, every level resolved), ``pip`` (pip's command parsers), ``bash SCRIPT`` (``bash -n``).
Other programs must exist on this machine (``shutil.which``) or be a shell builtin."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILTINS = {"export", "cd", ".", "source", "umask", "echo", "set", "unset", "true"}
# programs the manifest's cloud blocks name: checked to be named only, not present here
CLOUD_TOOLS = {"kubectl", "aws", "gcloud", "gsutil", "docker", "helm"}


class _Parsed(Exception):
    pass


def _argparse_script(path: Path, args: list[str]) -> None:
    """The script's parser on ``args``, stopped once it has parsed (nothing else runs)."""
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):  # noqa: ANN001
        real(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign]
    saved = sys.argv
    sys.argv = [str(path), *args]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except _Parsed:
        return
    finally:
        sys.argv = saved
        argparse.ArgumentParser.parse_args = real  # type: ignore[method-assign]
    raise RuntimeError(f"{path.name} ran without parsing any arguments")


def _click(group, name: str, args: list[str]) -> None:
    import click

    ctx = group.make_context(name, list(args))
    cmd: click.Command = group
    while isinstance(cmd, click.Group):
        rest = [*getattr(ctx, "protected_args", []), *ctx.args]
        if not rest:
            return
        sub_name, cmd, rest = cmd.resolve_command(ctx, rest)
        ctx = cmd.make_context(sub_name, rest, parent=ctx)


def check(argv: list[str]) -> str | None:
    prog, args = argv[0], argv[1:]
    if prog == "solaris":
        from solaris.cli import build_parser

        build_parser().parse_args(args)
    elif prog in ("python", "python3", "python3.11") and args[:1] == ["-c"]:
        compile(args[1], "<python -c>", "exec")
    elif prog in ("python", "python3", "python3.11") and args[:2] == ["-m", "venv"]:
        pass  # the standard library's
    elif prog in ("python", "python3", "python3.11"):
        script = ROOT / args[0]
        if not script.is_file():
            return f"{args[0]}: no such script in the repository"
        _argparse_script(script, args[1:])
    elif prog == "serve":
        from ray.serve.scripts import cli

        _click(cli, "serve", args)
    elif prog == "ray":
        from ray.scripts.scripts import cli

        _click(cli, "ray", args)
    elif prog == "pip":
        from pip._internal.commands import create_command

        options, _ = create_command(args[0]).parse_args(args[1:])
    elif prog == "bash":
        script = ROOT / args[0]
        if not script.is_file():
            return f"{args[0]}: no such script in the repository"
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        if done.returncode:
            return done.stderr.strip()
    elif prog in BUILTINS or prog in CLOUD_TOOLS:
        pass
    elif shutil.which(prog) is None:
        return f"{prog}: not a program on this machine"
    return None


def main() -> None:
    answers = []
    for argv in json.load(sys.stdin):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                answers.append(check(argv))
        except SystemExit as e:  # argparse / pip: the message went to stderr
            answers.append(err.getvalue().strip() or f"exit {e.code}")
        except Exception as e:  # noqa: BLE001 -- click's UsageError and the like
            answers.append(f"{type(e).__name__}: {e}")
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
