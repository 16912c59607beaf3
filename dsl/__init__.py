"""The .mk kernel language: grammar, front end and compiler to the ISA."""
