"""The TensorRT target's pieces: ``specs.py`` describes each plugin (size rules, kernel, grid,
constants) without importing TensorRT or Triton; ``plugin_launch.py`` launches a plugin's kernel
as TensorRT's AOT plugin would, on concrete tensors."""
