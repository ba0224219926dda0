"""Pictures: compare.png and timeline.png, sweep.png, the cluster bars and four_way.png, with
the colours, formats and panels they share."""
