"""The TensorRT target's pieces, built and tested where TensorRT cannot run (the target itself is
not registered yet: ``ssmcc.compile(..., target="tensorrt")`` still says it is planned):

    specs.py          each plugin as data: size, dtype, extras, grid and constant rules as
                      expressions over input dims (no TensorRT or Triton import)
    plugin_launch.py  a plugin's kernel launched as TensorRT's AOT plugin would, on tensors
    graphs.py         the ONNX lowering's portable graphs with each ssmcc node bound to its plugin
    kernels_aot.py    the plugin kernels' specialisations the graphs need, for the AOT build
"""
