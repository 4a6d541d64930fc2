"""The installed `eagle3` console script's old entry point; the command line lives in app/cli.py."""

from .app.cli import main as main
