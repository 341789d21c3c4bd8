"""zipccl-fsdp's GPU codec: Triton kernels and their launchers only.

Nothing here knows about torch.distributed. Importing this package does not
import triton; ``available()`` says whether the kernels can run.
"""


def available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover - depends on the install
        return False
    return True
