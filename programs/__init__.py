"""Shipped .mk programs and the numpy references they are checked against."""
