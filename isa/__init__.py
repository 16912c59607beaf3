"""The instruction set: every instruction declared once, plus the numeric contract and hardware profiles."""
