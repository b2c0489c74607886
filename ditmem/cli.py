"""The ``ditmem`` command: one subcommand per job, each implemented in its own module.

A subcommand module exposes ``add_arguments(parser)`` and ``main(args) -> int``. Only the
module of the subcommand being run is imported: the others may pull in diffusers or
FastAPI, which would slow every invocation down.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "serve": ("ditmem.server.cli", "run the HTTP server (OpenAI / vllm-omni compatible API)"),
    "bench": ("ditmem.tools.bench", "load-test a running server with a workload or trace"),
    "sim": ("ditmem.scheduler.cli", "simulate scheduling policies on a device profile"),
    "demo": ("ditmem.tools.demo", "replay a CPU-scaled seed-mix under fifo and slo"),
    "profile": ("ditmem.tools.profile", "measure a device profile for the simulator"),
}


def _load(module_name: str):
    """Import a subcommand module, or return None when it does not exist (yet)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return None
        raise


def build_parser(command: str | None) -> tuple[argparse.ArgumentParser, object]:
    """Build the parser; only ``command``'s module is imported to add its arguments."""
    parser = argparse.ArgumentParser(
        prog="ditmem", description="Preemptible, SLO-aware serving of diffusion transformers."
    )
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    module = None
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = _load(module_name)
            if module is not None:
                module.add_arguments(p)
    return parser, module


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser, module = build_parser(command if command in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if module is None:
        print(
            f"ditmem {args.command}: not available yet in this version "
            f"({SUBCOMMANDS[args.command][0]} is not implemented)",
            file=sys.stderr,
        )
        return 2
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
