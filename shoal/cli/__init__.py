"""The command-line tools: `shoal generate / rag / embed / batch / up / down / nodes /
drain / migrate / calibrate / make-model ...` (`main.py` parses and dispatches; a module
per command family) and what only they use (progress bars, resumable output files)."""

from shoal.cli.main import main

__all__ = ["main"]
