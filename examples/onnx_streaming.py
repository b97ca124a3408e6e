"""Compile a Mamba to ONNX, save it, load it back and stream tokens from the step graph.

    python examples/onnx_streaming.py [OUT_DIR]

The artifact holds prefill.onnx and step.onnx (sharing weights.bin) and manifest.json. Any
onnxruntime runs it (the ssmcc ops carry portable function bodies); ssmcc.load also registers the
ssmcc ONNX Runtime kernels when they can be built here.
"""

import sys
import tempfile

import torch
from transformers import MambaConfig, MambaForCausalLM

import ssmcc


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="ssmcc-example-") + "/m"
    torch.manual_seed(0)
    model = MambaForCausalLM(MambaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2))
    ssmcc.compile(model.eval(), target="onnx").save(out, overwrite=True)
    compiled = ssmcc.load(out)
    print(f"saved {out}: {sorted(compiled.manifest['files'])}")
    for spec in compiled.state_specs:
        print(f"  state {spec.name}: (batch, {', '.join(map(str, spec.shape))}) {spec.dtype}")

    prompt = torch.tensor([[11, 22, 33, 44]])
    print("greedy:", end=" ", flush=True)
    for token in compiled.stream(prompt, 12):
        print(int(token[0]), end=" ", flush=True)
    print()
    with torch.no_grad():
        reference = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    print("same as transformers generate:", torch.equal(compiled.generate(prompt, 12), reference))

    logits, state = compiled.prefill(prompt)  # keep the prompt's state ...
    state.save(out + ".state.pt")  # ... on disk, and resume from it later
    resumed, _ = compiled.step(torch.tensor([7]), ssmcc.State.load(out + ".state.pt"))
    print("resumed logits:", tuple(resumed.shape))


if __name__ == "__main__":
    main()
