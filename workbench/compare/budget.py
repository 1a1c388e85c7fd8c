"""Memory budget helpers (moved to :mod:`workbench.core.budget`); re-exported here."""

from ..core.budget import chunks, default_budget, infer_for_feed, parse_size, tensor_bytes  # noqa: F401
