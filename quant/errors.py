"""The quant package's error type."""


class QuantError(ValueError):
    """A tensor that cannot be stored in, or read from, a format."""
