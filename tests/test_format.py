"""The pinned code tables still follow from the Gaussian model, and the
format's bookkeeping agrees with itself."""
import dataclasses
import math

import torch

from zipccl_fsdp import format as F


def test_pinned_tables_follow_from_the_gaussian_model():
    order, lo7, lo6, lo5 = F.derive_tables()
    assert order == F.DENSE_ORDER
    assert lo7 == F.FIXED_LO
    assert lo6 == F.FIXED_LO_ZERO
    assert lo5 == F.FIXED_LO_ZERO2
    assert F.FIXED_LO_BY_ZEROS == (F.FIXED_LO, F.FIXED_LO_ZERO, F.FIXED_LO_ZERO2)


def test_dense_code_is_a_complete_prefix_code():
    # Every rank has one tier path, ranks leave in order, ESC continues everywhere.
    paths = [F.rank_tiers(r) for r in range(F.DENSE_SLOTS + 1)]
    assert len({tuple(p) for p in paths}) == len(paths)
    assert all(d == cap for t, d in paths[F.DENSE_ESC] for cap in [F.TIER_SYMBOLS[t]])
    for zp in (False, True):
        for zn in (False, True):
            for ph in range(4):
                syms = F.dense_symbol_table(zp, zn, ph)
                assert len(syms) == F.DENSE_SLOTS and len(set(syms)) == len(syms)
                # flagged zeros first (+0.0 before -0.0), then the exponent order
                first = [F.ZERO_SYMBOL] * zp + [F.NEG_ZERO_SYMBOL] * zn
                assert list(syms[:len(first)]) == first
                assert syms[len(first)] == F.DENSE_ORDER[ph][0]
                assert (F.ZERO_SYMBOL in syms) == (zp or not zn)
                assert (F.NEG_ZERO_SYMBOL in syms) == zn


def test_fixed3_zero_codes():
    assert F.fixed_zero_codes(0) == (0, -1, -1)
    assert F.fixed_zero_codes(F.FLAG_ZPOS) == (1, 0, -1)
    assert F.fixed_zero_codes(F.FLAG_ZNEG) == (1, -1, 0)
    assert F.fixed_zero_codes(F.FLAG_ZPOS | F.FLAG_ZNEG | F.FLAG_LOW16) == (2, 0, 1)
    z, cp, cn = F.fixed_zero_codes(torch.tensor([0, 2, 4, 6]))
    assert z.tolist() == [0, 1, 1, 2] and cp.tolist() == [-1, 0, -1, 0]
    assert cn.tolist() == [-1, -1, 0, 1]


def test_layout_is_aligned_and_offsets_are_a_prefix_sum():
    n = torch.tensor([4096, 4096, 77])
    t = F.ChunkTable(torch.tensor([1, 0, 1]), torch.tensor([0, 0, 2]), torch.tensor([120, 0, 120]),
                     torch.tensor([1, 0, 3]), torch.tensor([0, 0, 5]), torch.tensor([17, 0, 2]),
                     torch.zeros(3, 4, dtype=torch.int64))
    starts, size = F.segment_layout("fixed3", F.DTYPES[torch.bfloat16], n, t)
    assert starts.tolist() == [[0, 1536, 1536 + 4096, 1536 + 4096, 1536 + 4096 + 32],
                               [0, 0, 8192, 8192, 8192], [0, 32, 32 + 80, 32 + 80, 32 + 80 + 16]]
    assert size.tolist() == [1536 + 4096 + 32, 8192, 32 + 80 + 16]
    assert F.segment_offsets(size).tolist() == [0, (1536 + 4096 + 32) // 16,
                                                (1536 + 4096 + 32 + 8192) // 16]


def test_lowbyte_layout_and_rule():
    """fp32 LOWBYTE: sm 2 bytes a kept element, the bitmap (a bit an element)
    in rem, low (its set bits' bytes) after esc; the rule is strict."""
    n = torch.tensor([4096, 1003])
    t = F.ChunkTable(torch.tensor([1, 1]), torch.tensor([F.FLAG_LOWBYTE, F.FLAG_LOWBYTE | 2]),
                     torch.tensor([120, 120]), torch.tensor([1, 3]), torch.tensor([0, 100]),
                     torch.tensor([17, 2]), torch.zeros(2, 4, dtype=torch.int64))
    n_low = torch.tensor([40, 0])
    lens = F.segment_nbytes("fixed3", F.DTYPES[torch.float32], n, t, n_low)
    assert [v.tolist() for v in lens] == [[1536, 377], [8192, 2 * 903], [512, 126], [17, 2],
                                          [40, 0]]
    starts, size = F.segment_layout("fixed3", F.DTYPES[torch.float32], n, t, n_low)
    assert starts.tolist() == [[0, 1536, 1536 + 8192, 1536 + 8192 + 512, 1536 + 8192 + 512 + 32],
                               [0, 384, 384 + 1808, 384 + 1808 + 128, 384 + 1808 + 128 + 16]]
    assert size.tolist() == [1536 + 8192 + 512 + 32 + 48, 384 + 1808 + 128 + 16]
    # align16(2k) + align16(ceil(n / 8)) + align16(m) < align16(3k)
    assert F.lowbyte_wins(64, 64, 1) and not F.lowbyte_wins(64, 64, 40)
    assert not F.lowbyte_wins(7, 7, 0) and not F.lowbyte_wins(4096, 0, 0)
    assert F.lowbyte_wins(4096, 4096, 3568) and not F.lowbyte_wins(4096, 4096, 3569)


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


def test_header_bytes_patch_the_body_length_and_crc_as_pack_does():
    for shape, codec, dtype in (((4097,), "fixed3", torch.bfloat16), ((), "dense", torch.float16),
                                ((3, 1, 5, 7) * 4, "fixed3", torch.float32)):
        numel = math.prod(shape)
        nch = F.nchunks_for(numel)
        h = F.Header(codec, dtype, shape, numel, F.CHUNK_ELEMS, nch, 0)
        hb = F.HeaderBytes(h)
        for body in (0, 16, 16 * nch * 4096, (1 << 40) + 48):
            got = hb.with_body(body)
            assert bytes(got) == dataclasses.replace(h, body_nbytes=body).pack(), (shape, body)
