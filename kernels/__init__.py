"""Kernels for the ssmcc ops, by backend (``kernels/cpu``: C++, bound to the torch target and to
ONNX Runtime). Kernels register themselves against the ops in ``ssmcc.ops`` (``cpu/registration``);
the op library never imports them."""
