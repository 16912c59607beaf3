"""The .mk examples and their numpy references (a package, so the references load by import name)."""
