"""Error metrics (moved to :mod:`workbench.core.metrics`, shared with calibration); re-exported here."""

from ..core.metrics import (  # noqa: F401 - re-exported
    HIGHER_IS_BETTER,
    METRICS,
    ErrorStats,
    compute_metrics,
    decode_float,
    decode_metrics,
    encode_float,
    encode_metrics,
)
