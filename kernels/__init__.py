"""Kernels for the ssmcc ops, by backend (``kernels/cpu``, ``kernels/triton``).

Kernels register themselves against the ops in ``ssmcc.ops``; the op library never imports them.
This version ships no compiled kernel yet: every backend runs the op library's reference.
"""
