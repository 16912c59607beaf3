"""mkemu: a cycle-approximate emulator of TPU-like accelerator chips and the .mk kernel language."""

__version__ = "0.1.0"
