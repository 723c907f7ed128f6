"""From plan to trainer: ``PackLoader`` (a DataLoader with an exact length and a resumable
cursor) and the collate functions that turn a pack into a batch (torch, no Lightning).
"""
