"""Attention implementations: references and our Triton kernels."""
