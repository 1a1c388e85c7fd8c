"""The small shared base under ``compare/``, ``calibrate/``, ``report/`` and ``repair/``: progress and
cancellation, memory budgets, JSON float coding, metric descriptors, feed casting and weight-free shape
inference. It imports nothing from the packages above it."""
