"""The triton target: the program runs eagerly in PyTorch on a CUDA GPU, every ssmcc op on
ssmcc's Triton kernels (``kernels/triton``); with ``interpret=True`` the same kernels run in
Triton's interpreter on the CPU. Saved as the torch target's artifact (weight-less programs plus
one weights file); ``target.py`` implements the registry contract, ``decode_graph.py`` the decode
captured as CUDA graphs (``cuda_graphs``), ``casts.py`` 16-bit programs without float32
copies."""

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
        OptionSpec(
            "allow_tf32",
            False,
            "the SSD scan's float32 matrix products (a float32 model's, and the fused Mamba-2 "
            "mixer's in every dtype: it scans the conv's float32 output) on TF32 tensor cores "
            "instead of IEEE float32: each operand keeps 10 of float32's 23 mantissa bits, up "
            "to ~1e-3 relative error per operand and ~2e-3 per product (sums stay float32)",
            kind=bool,
            stages=(COMPILE, LOAD),
        ),
        OptionSpec(
            "cuda_graphs",
            True,
            "on a CUDA GPU, decode generate/stream as one CUDA graph per batch-size bucket "
            "(state pools, tokens chosen on the GPU); off (--no-cuda-graphs): each step runs "
            "eagerly, for debugging",
            kind=bool,
            stages=(COMPILE, LOAD),
        ),
    ),
)
