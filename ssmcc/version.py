"""The ssmcc version (its own module, so artifacts can record it without importing the API)."""

__version__ = "0.1.0"
