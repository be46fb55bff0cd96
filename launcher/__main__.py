"""``python -m launcher`` runs the `launch` CLI."""

from launcher.cli import main

main()
