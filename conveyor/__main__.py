"""``python -m conveyor`` runs the command line."""

from conveyor.cli import main

main()
