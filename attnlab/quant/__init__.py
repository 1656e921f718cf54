"""Weights stored small, and the kernels that read them.

One floor above nn/ (it finds a model's linears through nn's stacks) and below the models, which never
import it: a model is quantized from outside, by the runs and tasks that ask for it.
    quantize.py     int8 and NF4 frozen linears, the base a QLoRA adapter wraps (training)
    packed.py       int8, int4 and bf16 linears for decoding, and the PyTorch kernels they call
    pack_choice.py  whether a packed layer beats float32 at its shape on this machine (measured once)
    row_kernels.py  attnlab's one-row C++ operators (csrc/), built on the user's machine on first use
"""
