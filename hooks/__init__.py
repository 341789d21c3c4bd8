"""zipccl-fsdp's registration layer: FSDP2 comms, the DDP comm hook and the
DTensor/functional-collectives override. Thin: all work is in zipccl_fsdp."""
__zipccl_fsdp_part__ = True

# Whoever imports hooks.* first must get zipccl_fsdp fully initialized first:
# its __init__ imports hooks.registry, which imports zipccl_fsdp's modules.
import zipccl_fsdp  # noqa: E402,F401
