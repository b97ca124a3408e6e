"""Lowering: from the ssmcc IR to a target. One folder per target (``lowering/<name>/``), each
declaring one ``TARGET`` that ``registry.py`` discovers; ``table.py`` is the shape of an op table
entry. Importing this package loads no backend library."""
