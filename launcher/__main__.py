"""``python -m launcher`` runs the `launch` CLI."""

from launcher.cli.main import main

main()
