"""The engine layer: the loop that turns scheduler batches into executor runs."""
