"""Tools that read traces and run results."""
