"""Capture: ``torch.export`` with dynamic batch and sequence dims, known SSM implementations routed
to the ssmcc ops for the export's duration (``export.py``, ``routes.py``), token-id checks
(``inputs.py``), the capture report (``report.py``), and making a program captured at a static
length dynamic again (``dynamic_length.py``)."""
