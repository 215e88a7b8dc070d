"""`loadgen sim`: the built-in simulated server. Its flags are the simulator's own (loadgen/sim/cli.py):
main() hands it the arguments before argparse sees them; the parser here only lists it in `--help`."""
from __future__ import annotations


def add_parser(sub) -> None:
    sub.add_parser("sim", help="the built-in simulated server (see `loadgen sim --help`)", add_help=False)


def command(argv: list[str]) -> int:
    from loadgen.sim.cli import main as sim_main  # lazy: the simulator's server (aiohttp) only for `sim`

    return sim_main(argv)
