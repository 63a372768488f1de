"""`python -m ggtool`: the command line, whose entry point lives with the click layer (ggtool.commands)."""

from ggtool.commands import console as main

if __name__ == "__main__":
    main()
