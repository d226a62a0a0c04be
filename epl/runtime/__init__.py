"""Runtime transformations on the training step: gradient accumulation and the
memory savers (ZeRO, gradient checkpointing, AMP, offload, grouped apply)."""
