"""The scheduler layer: requests, queue orders, admission and the scheduling loop.

Imports the cache layer only; nothing here knows which executor runs the batches.
"""
