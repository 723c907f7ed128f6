"""Measuring balance and cost: the simulator and the metrics of docs/metrics.md, plots, the calibration
of a cost model against a real model's step times, and dataset inspection.
"""
