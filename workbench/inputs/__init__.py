"""Feeds for a model: random ones shaped after its inputs, ones loaded from files, and checks of both."""

from __future__ import annotations

from .check import check_feeds
from .files import MAX_FEED_BYTES, feeds_from, load_feeds
from .generate import random_feeds
from .overrides import parse_range_overrides, parse_shape_overrides
from .spec import InputSpec, model_inputs

__all__ = [
    "MAX_FEED_BYTES",
    "InputSpec",
    "check_feeds",
    "feeds_from",
    "load_feeds",
    "model_inputs",
    "parse_range_overrides",
    "parse_shape_overrides",
    "random_feeds",
]
