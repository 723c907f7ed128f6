"""Measuring balance and cost: the simulator and DESIGN.md's metrics, plots, the calibration
of a cost model against a real model's step times, and dataset inspection.
"""
