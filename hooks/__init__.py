"""zipccl-fsdp's registration layer: FSDP2 comms, the DDP comm hook and the
DTensor/functional-collectives override. Thin: all work is in zipccl_fsdp."""

# hooks -> zipccl_fsdp, one way: zipccl_fsdp loads hooks' names only on first
# use. The registry installs FSDPModule.register_comm_hook.
import zipccl_fsdp  # noqa: E402,F401
from . import registry  # noqa: E402,F401
