"""Readers: safetensors (file, HF folder) and GGUF, one tensor model."""
