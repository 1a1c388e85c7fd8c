"""``python -m workbench``."""

from .cli import entry

entry()
