"""The onnx target: one ``ssmcc``-domain node per ssmcc op with a portable function body, run in
ONNX Runtime (with ssmcc's custom-op library when it builds); ``target.py`` implements the
registry contract."""

from ssmcc.lowering.registry import Target
from ssmcc.options import COMPILE, LOAD, QUANTIZE, OptionSpec

TARGET = Target(
    name="onnx",
    summary="ONNX graphs (prefill/chunk/step, one weights file) run in ONNX Runtime",
    implementation="ssmcc.lowering.onnx.target",
    dtypes=("float32",),
    quantize=QUANTIZE,
    options=(
        OptionSpec(
            "threads",
            None,
            "ONNX Runtime intra-op threads (default: ONNX Runtime's choice)",
            kind=int,
            minimum=1,
            nullable=True,
            stages=(COMPILE, LOAD),
            metavar="N",
        ),
        OptionSpec(
            "onnx_functions",
            "keep",
            "keep: one ssmcc-domain node per ssmcc op with its body as a model-local function "
            "(ONNX Runtime runs the nodes with ssmcc's library, or the bodies); inline: the "
            "bodies written into the graphs, standard ONNX ops only, for runtimes that do not "
            "expand model-local functions (OpenVINO); ssmcc's library is then not used",
            choices=("keep", "inline"),
        ),
    ),
)
