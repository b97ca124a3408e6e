"""Serving compiled models beyond one process: Triton Inference Server model repositories
(``export_triton``), a local server (``TritonServer``) and a streaming client (``Client``)."""

from ssmcc.serving.client import Client
from ssmcc.serving.server import TritonServer
from ssmcc.serving.triton_repository import FLAVOURS, export_triton

__all__ = ["FLAVOURS", "Client", "TritonServer", "export_triton"]
