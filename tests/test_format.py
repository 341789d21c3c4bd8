"""The pinned code tables still follow from the Gaussian model, and the
format's bookkeeping agrees with itself."""
import subprocess
import sys
import textwrap

import torch

from zipccl_fsdp import format as F


def test_pinned_tables_follow_from_the_gaussian_model():
    order, lo7, lo6 = F.derive_tables()
    assert order == F.DENSE_ORDER
    assert lo7 == F.FIXED_LO
    assert lo6 == F.FIXED_LO_ZERO


def test_dense_code_is_a_complete_prefix_code():
    # Every rank has one tier path, ranks leave in order, ESC continues everywhere.
    paths = [F.rank_tiers(r) for r in range(F.DENSE_SLOTS + 1)]
    assert len({tuple(p) for p in paths}) == len(paths)
    assert all(d == cap for t, d in paths[F.DENSE_ESC] for cap in [F.TIER_SYMBOLS[t]])
    for zf in (False, True):
        for ph in range(4):
            syms = F.dense_symbol_table(zf, ph)
            assert len(syms) == F.DENSE_SLOTS and len(set(syms)) == len(syms)


def test_chunk_table_bytes_round_trip():
    g = torch.Generator().manual_seed(0)
    n = 5
    t = F.ChunkTable(*(torch.randint(0, 256, (n,), generator=g) for _ in range(4)),
                     *(torch.randint(0, 65536, (n,), generator=g) for _ in range(2)),
                     torch.randint(0, 65536, (n, 4), generator=g))
    b = t.to_bytes()
    assert b.numel() == n * F.CHUNK_ENTRY_NBYTES
    u = F.ChunkTable.from_bytes(b, n)
    for f in ("mode", "flags", "base", "phase", "n_zero", "n_esc", "n_open"):
        assert torch.equal(getattr(t, f), getattr(u, f)), f


def test_foreign_triton_kernels_module_is_refused(tmp_path):
    (tmp_path / "triton_kernels").mkdir()
    (tmp_path / "triton_kernels" / "__init__.py").write_text("# someone else's\n")
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import zipccl_fsdp
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode != 0
    assert "foreign module named 'triton_kernels'" in r.stderr
    assert str(tmp_path) in r.stderr
