"""ssmcc CPU kernels (C++), bound to the torch target (ctypes) and to ONNX Runtime (custom ops)."""

from ssmcc.kernels.cpu.build import build_ort_library, build_torch_kernels, find_ort_headers

__all__ = ["build_ort_library", "build_torch_kernels", "find_ort_headers"]
