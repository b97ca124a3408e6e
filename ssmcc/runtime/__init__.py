"""What runs a compiled or loaded model, above every target: ``CompiledModel`` (calls, chunked
prefill, step, generation), ``State``, ``PrefixCache``, the compile report and artifact
directories."""
