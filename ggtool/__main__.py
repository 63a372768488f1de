"""`ggtool` and `python -m ggtool`: the command line (the click layer lives in ggtool.commands).

The worker processes a `compute --threads N` will use are launched before anything heavy is
imported (ggtool.pool.launch), so that they load numpy and ggtool while this process does."""

import sys


def main() -> None:
    from ggtool.pool.launch import prestart

    prestart(sys.argv[1:])
    from ggtool.commands import main as command_line

    command_line()


if __name__ == "__main__":
    main()
