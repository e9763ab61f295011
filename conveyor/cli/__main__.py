"""``python -m conveyor.cli`` runs the command line, as ``python -m conveyor`` does."""

from conveyor.cli import main

main()
