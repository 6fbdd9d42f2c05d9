"""Rotary encodings: the RoPE module, its apply kernels, the scalings, xPos."""
