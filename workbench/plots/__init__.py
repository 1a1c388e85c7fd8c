"""Plots: pure functions from results (or arrays) to plotly Figures; they never run an engine.

Import the submodules (``workbench.plots.compare``, ...) directly: this package imports nothing heavy.
"""
