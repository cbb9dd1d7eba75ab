"""orkpack: compile LLM checkpoints into mixed int8/NF4 packs for the RK3588 NPU."""
__version__ = "0.1.0"
