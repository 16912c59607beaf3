"""The emulator: chips, cores, DMA engines and the interconnect, driven by one event loop."""
