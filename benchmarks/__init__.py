"""ssmcc benchmarks: ``python -m benchmarks.run --help``. Not part of the installed package."""
