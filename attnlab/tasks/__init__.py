"""Tasks beyond language modelling, each a thin layer over data sources, models and the shared loop."""
