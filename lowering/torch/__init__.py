"""The torch target: the program runs eagerly in PyTorch, ssmcc ops through the table below."""

from ssmcc.lowering.torch.lower import TORCH_TABLE, lower_to_torch

__all__ = ["TORCH_TABLE", "lower_to_torch"]
