"""zipccl-fsdp's registration layer: FSDP2 comms, the DDP comm hook and the
DTensor/functional-collectives override. Thin: all work is in zipccl_fsdp."""
__zipccl_fsdp_part__ = True
