"""The tensorrt target: ONNX graphs whose ssmcc nodes are TensorRT plugins, the plugins' kernels
ssmcc's Triton kernels compiled ahead of time to PTX; ``target.py`` implements the registry
contract. TensorRT cannot be installed where ssmcc is developed: what runs here is tested here
(the graphs, the PTX, the plugins' rules and kernels), the engine build and the runner have not
been run on a real TensorRT (docs/targets/tensorrt.md says which parts).

    specs.py          each plugin as data: size, dtype, extras, grid and constant rules as
                      expressions over input dims (no TensorRT or Triton import)
    plugin_launch.py  a plugin's kernel launched as TensorRT's AOT plugin would, on tensors
    graphs.py         the ONNX lowering's portable graphs with each ssmcc node bound to its plugin
    scan_chain.py     each SelectiveScan node as a chain of three plugin nodes (chunked scan)
    ssd_chain.py      each SsdScan node as a chain of five plugin nodes (SSD's chunked kernels)
    chain_rewrite.py  what the two chains share: a chain as data, its nodes, the graph rewrite
    kernels_aot.py    the plugin kernels' specialisations the graphs need, built to PTX
    plugins.py        the plugins registered with ``tensorrt.plugin`` (where it imports)
    engines.py        engine build (``ssmcc trt-build``) and the runner
"""

from ssmcc.lowering.registry import Target
from ssmcc.options import OptionSpec

TARGET = Target(
    name="tensorrt",
    summary="TensorRT-ready artifact: ONNX graphs with ssmcc's ops as TensorRT plugins (their "
    "Triton kernels as PTX for sm_80-sm_90); engines built by `ssmcc trt-build` where TensorRT is",
    implementation="ssmcc.lowering.tensorrt.target",
    dtypes=("float32",),
    builds_on=("onnx", "triton"),
    options=(
        OptionSpec(
            "archs",
            "sm_80,sm_86,sm_89,sm_90",
            "GPU architectures to build the plugins' PTX for, comma-separated",
            metavar="LIST",
        ),
        OptionSpec(
            "max_batch",
            8,
            "largest batch of the engines' optimisation profiles",
            kind=int,
            minimum=1,
            metavar="N",
        ),
        OptionSpec(
            "max_length",
            4096,
            "longest prompt chunk of the engines' optimisation profiles (tokens)",
            kind=int,
            minimum=1,
            metavar="N",
        ),
    ),
)
