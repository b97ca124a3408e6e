"""The triton target: the program runs eagerly in PyTorch on a CUDA GPU, every ssmcc op on
ssmcc's Triton kernels (``kernels/triton``); with ``interpret=True`` the same kernels run in
Triton's interpreter on the CPU. Saved as the torch target's artifact (weight-less programs plus
one weights file); ``target.py`` implements the registry contract."""

from ssmcc.lowering.registry import Target
from ssmcc.options import COMPILE, LOAD, QUANTIZE, OptionSpec

TARGET = Target(
    name="triton",
    summary="PyTorch on a CUDA GPU with ssmcc's Triton kernels (interpret=True: Triton's "
    "interpreter on the CPU); saved as .pt2 programs + safetensors",
    implementation="ssmcc.lowering.triton.target",
    dtypes=("float32", "bfloat16", "float16"),
    quantize=QUANTIZE,
    builds_on=("torch",),  # the torch target's artifact and weight freezing
    options=(
        OptionSpec(
            "interpret",
            False,
            "run the Triton kernels in Triton's interpreter on the CPU (the program's tensors "
            "live there) instead of compiled on a CUDA GPU: slow, for testing without a GPU",
            kind=bool,
            stages=(COMPILE, LOAD),
        ),
    ),
)
