"""Runnable examples: ``torchrun --standalone --nproc_per_node=2 -m layerscope.examples.ddp_train run/``."""
