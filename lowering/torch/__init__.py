"""The torch target: the program runs eagerly in PyTorch, ssmcc ops on ssmcc's C++ CPU kernels
(``lower.py``, ``freeze.py``); saved as weight-less programs plus one memory-mapped weights file
(``weights.py``); ``target.py`` implements the registry contract."""

from ssmcc.lowering.registry import Target
from ssmcc.options import QUANTIZE

TARGET = Target(
    name="torch",
    summary="eager PyTorch with ssmcc's C++ CPU kernels; saved as .pt2 programs + safetensors",
    implementation="ssmcc.lowering.torch.target",
    dtypes=("float32", "bfloat16", "float16"),
    quantize=QUANTIZE,
)
