"""`python -m ggtool`: the command line (the click layer lives in ggtool.commands)."""

from ggtool.commands import main

main()
