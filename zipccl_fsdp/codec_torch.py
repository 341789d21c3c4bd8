"""The torch backend: the reference implementation of the format, in plain
vectorized torch ops (CPU or CUDA). Every other backend must produce the same
bytes; tests compare them against this one.

Everything works on a (nchunks, chunk_elems) view; the last chunk is padded
and the padding masked out, so no loop ever runs over chunks or elements. The
only loops run over the handful of dense-code tiers.
"""
from __future__ import annotations

import torch

from . import format as F
from .errors import CorruptPayloadError

_INT_VIEW = {2: torch.int16, 4: torch.int32}


# --------------------------------------------------------------------------
# Bit packing: value i of a row occupies bits [bits*i, bits*(i+1)), LSB first.
# --------------------------------------------------------------------------
def pack_bits(values: torch.Tensor, bits: int) -> torch.Tensor:
    """(rows, L) ints < 2**bits -> (rows, L*bits/8) uint8; L a multiple of 8."""
    rows, L = values.shape
    g = 8 // bits if bits in (1, 2, 4) else 8
    shifts = torch.arange(g, device=values.device, dtype=torch.int32) * bits
    acc = (values.view(rows, L // g, g).to(torch.int32) << shifts).sum(2, dtype=torch.int32)
    nb = g * bits // 8
    if nb == 1:
        return acc.to(torch.uint8)
    parts = [((acc >> (8 * k)) & 0xFF).to(torch.uint8) for k in range(nb)]
    return torch.stack(parts, 2).view(rows, L * bits // 8)


def unpack_bits(packed: torch.Tensor, bits: int, L: int) -> torch.Tensor:
    """Inverse of pack_bits: (rows, L*bits/8) uint8 -> (rows, L) int32."""
    rows = packed.shape[0]
    g = 8 // bits if bits in (1, 2, 4) else 8
    nb = g * bits // 8
    b = packed.view(rows, L // g, nb).to(torch.int32)
    acc = b[..., 0]
    for k in range(1, nb):
        acc = acc | (b[..., k] << (8 * k))
    shifts = torch.arange(g, device=packed.device, dtype=torch.int32) * bits
    return ((acc[..., None] >> shifts) & ((1 << bits) - 1)).view(rows, L)


# --------------------------------------------------------------------------
# Element fields
# --------------------------------------------------------------------------
def _words(x: torch.Tensor, info: F.DTypeInfo, nchunks: int, C: int):
    """(nchunks, C) int32 unsigned words and the validity mask of padding."""
    flat = x.reshape(-1).view(_INT_VIEW[info.itemsize]).to(torch.int32)
    if info.itemsize == 2:
        flat = flat & 0xFFFF
    pad = nchunks * C - flat.numel()
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    valid = torch.arange(nchunks * C, device=x.device) < x.numel()
    return flat.view(nchunks, C), valid.view(nchunks, C)


def _split(W: torch.Tensor, info: F.DTypeInfo):
    """Exponent field and sign+mantissa field (sign on top)."""
    m = info.man_bits
    e = (W >> m) & info.emax
    sign_shift = m + info.exp_bits
    sm = ((W >> sign_shift) & 1) << m | (W & ((1 << m) - 1))
    return e, sm


def _join(e: torch.Tensor, sm: torch.Tensor, info: F.DTypeInfo) -> torch.Tensor:
    m = info.man_bits
    sign = (sm >> m) & 1
    return (sign << (m + info.exp_bits)) | (e << m) | (sm & ((1 << m) - 1))


def _locator(e, valid, info):
    normal = valid & (e > 0) & (e < info.emax)
    S = torch.where(normal, e, 0).sum(1, dtype=torch.int64)
    K = normal.sum(1, dtype=torch.int64)
    q = torch.where(K > 0, torch.div(4 * S, K.clamp(min=1), rounding_mode="floor"), 0)
    return q >> 2, q & 3


_R = 64  # offsets from base are clamped into [-_R, _R]; the tables use |d| <= 6


def _symbol_tables(device):
    """(2 zpos, 2 zneg, 4 phase, DENSE_SLOTS) symbol tables of format.dense_symbol_table."""
    t = [[[F.dense_symbol_table(bool(zp), bool(zn), ph) for ph in range(4)] for zn in range(2)]
         for zp in range(2)]
    return torch.tensor(t, dtype=torch.int64, device=device)


def _dense_rank_lut(device):
    """(2, 2, 4, 2*_R+1 offset) -> rank (DENSE_ESC when absent), and
    (2, 2, 4, 2) -> rank of +0.0 / -0.0 (-1 when absent)."""
    lut = torch.full((2, 2, 4, 2 * _R + 1), F.DENSE_ESC, dtype=torch.int64)
    zrank = torch.full((2, 2, 4, 2), -1, dtype=torch.int64)
    for zp in range(2):
        for zn in range(2):
            for ph in range(4):
                for rank, sym in enumerate(F.dense_symbol_table(bool(zp), bool(zn), ph)):
                    if sym == F.ZERO_SYMBOL:
                        zrank[zp, zn, ph, 0] = rank
                    elif sym == F.NEG_ZERO_SYMBOL:
                        zrank[zp, zn, ph, 1] = rank
                    else:
                        lut[zp, zn, ph, sym + _R] = rank
    return lut.to(device), zrank.to(device)


def _fixed_window(base, phase, z, info):
    """fixed3 window start and width per chunk (format.py, "fixed3")."""
    lo_tab = torch.tensor(F.FIXED_LO_BY_ZEROS, device=base.device)
    width = 7 - z
    lo = (base + lo_tab[z, phase]).clamp(min=0)
    return torch.minimum(lo, info.emax + 1 - width), width


def _front(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Each row's kept values moved to its front, in order; zeros after."""
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    moved = torch.gather(values, 1, order)
    count = keep.sum(1, keepdim=True)
    cols = torch.arange(values.shape[1], device=values.device)
    return torch.where(cols[None, :] < count, moved, 0)


def _pad_cols(rows: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(rows, (0, width - rows.shape[1])) if width > rows.shape[1] else rows


def _assemble_body(parts, starts: torch.Tensor, lengths) -> torch.Tensor:
    """The body: per chunk (row), part p's row prefix of align16(lengths[p])
    bytes at its segment start; parts are uint8 rows zero past their length."""
    widths = [F.align16(r.shape[1]) for r in parts]
    rows = torch.cat([_pad_cols(r, w) for r, w in zip(parts, widths)], 1)
    col_start = torch.tensor([sum(widths[:i]) for i in range(len(widths))], device=rows.device)
    cols = torch.arange(rows.shape[1], device=rows.device)
    part = torch.bucketize(cols, col_start, right=True) - 1
    padded = torch.stack([F.align16(ln) for ln in lengths], 1)  # (nch, parts)
    keep = (cols - col_start[part])[None, :] < padded[:, part]
    return rows[keep]


# --------------------------------------------------------------------------
# Encode
# --------------------------------------------------------------------------
def encode(x: torch.Tensor, codec: str) -> torch.Tensor:
    info = F.dtype_info(x.dtype)
    numel = x.numel()
    dev = x.device
    if numel * info.itemsize > F.MAX_BODY_NBYTES - F.ALIGN:
        raise ValueError(f"a tensor of {numel * info.itemsize} bytes exceeds what format "
                         f"version {F.VERSION} addresses ({F.MAX_BODY_NBYTES - F.ALIGN} bytes)")
    C = F.CHUNK_ELEMS
    nch = F.nchunks_for(numel, C) if codec != "raw" else 0
    header = F.Header(codec, x.dtype, tuple(x.shape), numel, C if codec != "raw" else 0,
                      nch, numel * info.itemsize if codec == "raw" else 0)
    if codec == "raw" or numel == 0:
        head = header.to_tensor(dev)
        body = x.reshape(-1).view(torch.uint8) if codec == "raw" else head[:0]
        return torch.cat([head, body])

    W, valid = _words(x, info, nch, C)
    e, sm = _split(W, info)
    n = F.chunk_lengths(numel, nch, C, dev)
    base, phase = _locator(e, valid, info)
    is_zpos = (W == 0) & valid
    is_zneg = (W == info.sign_word) & valid
    npos = is_zpos.sum(1, dtype=torch.int64)
    nneg = is_zneg.sum(1, dtype=torch.int64)
    flags = torch.zeros_like(n)
    if info.dtype == torch.float32:
        low16 = (((W & 0xFFFF) == 0) | ~valid).all(1)
        flags |= torch.where(low16, F.FLAG_LOW16, 0)
    low16 = (flags & F.FLAG_LOW16) != 0
    shift = F.FIXED_ZERO_SLOT_SHIFT if codec == "fixed3" else F.DENSE_ZERO_FIRST_SHIFT
    zp = (npos << shift) >= n
    zn = (nneg << shift) >= n
    flags |= torch.where(zp, F.FLAG_ZPOS, 0) | torch.where(zn, F.FLAG_ZNEG, 0)

    if codec == "fixed3":
        z, cpos, cneg = F.fixed_zero_codes(flags)
        lo, width = _fixed_window(base, phase, z, info)
        d = e - lo[:, None]
        inwin = (d >= 0) & (d < width[:, None])
        code = torch.where(inwin, d + z[:, None], F.FIXED_ESC)
        zpos_coded = zp[:, None] & is_zpos
        zneg_coded = zn[:, None] & is_zneg
        code = torch.where(zpos_coded, cpos[:, None], code)
        code = torch.where(zneg_coded, cneg[:, None], code)
        code = torch.where(valid, code, 0)
        esc = valid & (code == F.FIXED_ESC)
        n_open = torch.zeros(nch, 4, dtype=torch.int64, device=dev)
        codes_rows = pack_bits(code, F.FIXED_BITS)  # (nch, 3C/8), zero past each chunk's end
    else:
        lut, zrank = _dense_rank_lut(dev)
        zpl, znl = zp.long()[:, None], zn.long()[:, None]
        d = (e - base[:, None]).clamp(-_R, _R) + _R
        rank = lut[zpl, znl, phase[:, None], d]
        rpos = zrank[zpl, znl, phase[:, None], 0]  # (nch, 1), -1 when +0.0 has no symbol
        rneg = zrank[zpl, znl, phase[:, None], 1]
        zpos_coded = is_zpos & (rpos >= 0)
        zneg_coded = is_zneg & (rneg >= 0)
        rank = torch.where(zpos_coded, rpos, rank)
        rank = torch.where(zneg_coded, rneg, rank)
        esc = valid & (rank == F.DENSE_ESC)
        tier_rows, tier_keep, opens = [], [], []
        for t, (bits, cap, start) in enumerate(zip(F.TIER_BITS, F.TIER_SYMBOLS, F.TIER_START)):
            open_t = valid & (rank >= start)
            if t:
                opens.append(open_t.sum(1, dtype=torch.int64))
            digit = (rank - start).clamp(max=cap)
            digits = _front(torch.where(open_t, digit, 0), open_t)
            cnt = opens[-1] if t else n
            rows_t = pack_bits(digits, bits)
            tier_rows.append(rows_t)
            tier_keep.append(torch.arange(rows_t.shape[1], device=dev)[None, :]
                             < F.packed_nbytes(cnt, bits)[:, None])
        n_open = torch.stack(opens, 1)
        # codes: the tiers' byte-aligned prefixes, tier after tier, at the row's front
        codes_rows = _front(torch.cat(tier_rows, 1), torch.cat(tier_keep, 1))
    omitted = zpos_coded | zneg_coded

    n_esc = esc.sum(1, dtype=torch.int64)
    nz = omitted.sum(1, dtype=torch.int64)
    # LOWBYTE (format.py): elements whose low byte is not zero (no zero's is).
    nz_low = valid & ((W & 0xFF) != 0)
    n_low = nz_low.sum(1, dtype=torch.int64)
    if info.dtype == torch.float32:
        lowbyte = ~low16 & F.lowbyte_wins(n, n - nz, n_low)
        flags |= torch.where(lowbyte, F.FLAG_LOWBYTE, 0)
    table = F.ChunkTable(torch.full_like(n, F.MODE_CODED), flags, base, phase, nz, n_esc, n_open)
    _, seg = F.segment_layout(codec, info, n, table, n_low)
    # Chunks of +0.0 alone are ZERO, chunks that do not shrink are stored raw;
    # the table entries of both are their mode and zeros.
    zero_chunk = npos == n
    coded = (seg < F.align16(n * info.itemsize)) & ~zero_chunk
    raw_chunk = ~coded & ~zero_chunk
    z0 = torch.zeros_like(n)
    mode = torch.where(coded, F.MODE_CODED, torch.where(zero_chunk, F.MODE_ZERO, F.MODE_RAW))
    table = F.ChunkTable(mode,
                         torch.where(coded, flags, z0), torch.where(coded, base, z0),
                         torch.where(coded, phase, z0), torch.where(coded, nz, z0),
                         torch.where(coded, n_esc, z0), torch.where(coded[:, None], n_open, 0))
    lengths = F.segment_nbytes(codec, info, n, table, n_low)
    starts, seg = F.segment_layout(codec, info, n, table, n_low)
    offsets = F.segment_offsets(seg)

    # sm: coded chunks ship the kept elements' sm bytes; raw chunks their words.
    if info.dtype == torch.float32:
        lowbyte = coded & lowbyte
        smb = torch.where(low16, 1, torch.where(lowbyte, 2, 3))
        sm_val = torch.where(low16[:, None], sm >> 16, torch.where(lowbyte[:, None], sm >> 8, sm))
    else:
        smb = torch.ones_like(n)
        sm_val = sm & 0xFF
    value = torch.where(raw_chunk[:, None], W, sm_val)
    nbytes = torch.where(raw_chunk, info.itemsize, smb)
    elem_keep = valid & ~zero_chunk[:, None] & ~(coded[:, None] & omitted)
    byte_idx = torch.arange(4, device=dev)
    byte_keep = (elem_keep[..., None] & (byte_idx < nbytes[:, None, None])).view(nch, 4 * C)
    vbytes = value.contiguous().view(torch.uint8).view(nch, 4 * C)
    sm_rows = _front(vbytes, byte_keep)

    coded_col = coded[:, None]
    codes_rows = torch.where(coded_col, codes_rows, 0)
    low_rows = codes_rows[:, :0].to(torch.uint8)
    if info.dtype == torch.float16:
        keep_rem = elem_keep & coded_col
        rem_rows = pack_bits(_front(torch.where(keep_rem, sm >> 8, 0), keep_rem), F.REM_BITS)
    elif info.dtype == torch.float32 and bool(lowbyte.any()):
        # rem: the bitmap of nonzero low bytes; low: those bytes in order.
        take = nz_low & lowbyte[:, None]
        rem_rows = pack_bits(take.to(torch.int32), 1)
        low_rows = _front(torch.where(take, W & 0xFF, 0).to(torch.uint8), take)
    else:
        rem_rows = codes_rows[:, :0]
    esc_rows = _front(torch.where(esc & coded_col, e, 0).to(torch.uint8), esc & coded_col)
    body = _assemble_body([codes_rows.to(torch.uint8), sm_rows, rem_rows.to(torch.uint8),
                           esc_rows, low_rows], starts, lengths)

    header.body_nbytes = int(body.numel())
    head = header.to_tensor(dev)
    table_bytes = torch.cat([table.to_bytes(), F.offsets_to_bytes(offsets)])
    gap = head.new_zeros(header.body_offset - header.offsets_offset - F.OFFSET_NBYTES * nch)
    return torch.cat([head, table_bytes, gap, body])


# --------------------------------------------------------------------------
# Decode
# --------------------------------------------------------------------------
def _gather_rows(payload: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor,
                 width: int) -> torch.Tensor:
    """(nch, width) uint8: row c holds payload[starts[c] : starts[c] + lengths[c]], zero-padded."""
    cols = torch.arange(width, device=payload.device)
    inside = cols[None, :] < lengths[:, None]
    idx = torch.where(inside, starts[:, None] + cols[None, :], 0)
    return torch.where(inside, payload[idx], 0)


def check_table(payload: torch.Tensor, header: F.Header):
    """The table, offsets and layout of a parsed coded payload, checked
    against each other and the body length: (table, n, stream lengths,
    absolute sub-stream starts)."""
    info = F.DTYPES[header.dtype]
    nch = header.nchunks
    table, offsets = F.read_table(payload, header)
    n = F.chunk_lengths(header.numel, nch, header.chunk_elems, payload.device)
    F.validate_table(header.codec, info, n, table)
    n_low, bad_bits = F.low_counts(payload, header, table, offsets)
    starts, seg = F.segment_layout(header.codec, info, n, table, n_low)
    F.validate_offsets(offsets, seg, header.body_nbytes)
    lengths = F.segment_nbytes(header.codec, info, n, table, n_low)
    starts = header.body_offset + F.ALIGN * offsets[:, None] + starts
    F.check_padding(payload, header, lengths, starts, bad_bits)
    return table, n, lengths, starts


def decode(payload: torch.Tensor, header: F.Header, out: torch.Tensor) -> torch.Tensor:
    info = F.DTYPES[header.dtype]
    dev = payload.device
    flat_out = out.reshape(-1).view(_INT_VIEW[info.itemsize])
    if header.codec == "raw":
        out.reshape(-1).view(torch.uint8).copy_(
            payload[header.body_offset:header.body_offset + header.body_nbytes])
        return out
    numel, C, nch = header.numel, header.chunk_elems, header.nchunks
    if numel == 0:
        return out
    table, n, lengths, at = check_table(payload, header)
    codes_len, sm_len, rem_len, esc_len, low_len = lengths
    coded = table.mode == F.MODE_CODED
    valid = (torch.arange(C, device=dev)[None, :] < n[:, None])
    low16 = (table.flags & F.FLAG_LOW16) != 0
    lowbyte = coded & ((table.flags & F.FLAG_LOWBYTE) != 0)
    base, phase = table.base, table.phase
    zp = (table.flags & F.FLAG_ZPOS) != 0
    zn = (table.flags & F.FLAG_ZNEG) != 0

    if header.codec == "fixed3":
        rows = _gather_rows(payload, at[:, 0], codes_len, C * F.FIXED_BITS // 8)
        code = unpack_bits(rows, F.FIXED_BITS, C).to(torch.int64)
        z, cpos, cneg = F.fixed_zero_codes(table.flags)
        lo, _ = _fixed_window(base, phase, z, info)
        is_zero = code < z[:, None]
        neg_zero = is_zero & (code == cneg[:, None])
        e = lo[:, None] + code - z[:, None]
        esc = code == F.FIXED_ESC
    else:
        rank = torch.zeros(nch, C, dtype=torch.int64, device=dev)
        open_t = valid.clone()
        part_off = at[:, 0]
        counts = torch.cat([n[:, None], table.n_open], 1)
        for t, (bits, cap) in enumerate(zip(F.TIER_BITS, F.TIER_SYMBOLS)):
            if t:
                got_open = open_t.sum(1)
                if bool((coded & (got_open != counts[:, t])).any()):
                    raise CorruptPayloadError(f"dense tier {t} open counts disagree with the table")
            ln = torch.where(coded, F.packed_nbytes(counts[:, t], bits), 0)
            rows = _gather_rows(payload, part_off, ln, C * bits // 8)
            part_off = part_off + ln
            digits = unpack_bits(rows, bits, C).to(torch.int64)
            pos = (torch.cumsum(open_t, 1) - 1).clamp(min=0)
            digit = torch.gather(digits, 1, pos)
            rank = rank + torch.where(open_t, digit, 0)
            open_t = open_t & (digit == cap)
        esc = open_t
        rank = rank.clamp(max=F.DENSE_SLOTS - 1)
        sym = _symbol_tables(dev)[zp.long()[:, None], zn.long()[:, None], phase[:, None], rank]
        is_zero = ((sym == F.ZERO_SYMBOL) | (sym == F.NEG_ZERO_SYMBOL)) & ~esc
        neg_zero = is_zero & (sym == F.NEG_ZERO_SYMBOL)
        e = base[:, None] + sym

    esc = esc & valid & coded[:, None]
    is_zero = is_zero & valid & coded[:, None]
    if bool((coded & (esc.sum(1) != table.n_esc)).any()) or \
            bool((coded & (is_zero.sum(1) != table.n_zero)).any()):
        raise CorruptPayloadError("decoded escape/zero counts disagree with the chunk table")
    esc_rows = _gather_rows(payload, at[:, 3], esc_len, C)
    esc_e = torch.gather(esc_rows, 1, (torch.cumsum(esc, 1) - 1).clamp(min=0)).to(torch.int64)
    e = torch.where(esc, esc_e, e)
    live = valid & coded[:, None] & ~is_zero
    if bool((live & ((e < 0) | (e > info.emax))).any()):
        raise CorruptPayloadError("a code decodes to an exponent outside the dtype")

    # sm bytes: kept elements of coded chunks, smb bytes each; raw chunks: words.
    if info.dtype == torch.float32:
        smb = torch.where(low16, 1, torch.where(lowbyte, 2, 3))
    else:
        smb = torch.ones_like(n)
    nbytes = torch.where(coded, smb, info.itemsize)  # ZERO chunks: sm_len 0, words 0
    elem_keep = valid & ~is_zero
    elem_rank = torch.cumsum(elem_keep, 1) - 1
    sm_rows = _gather_rows(payload, at[:, 1], sm_len, C * info.itemsize)
    word = torch.zeros(nch, C, dtype=torch.int64, device=dev)
    for b in range(max(info.itemsize, 3 if info.dtype == torch.float32 else 1)):
        has = elem_keep & (b < nbytes[:, None])
        if not bool(has.any()):
            continue
        idx = torch.where(has, elem_rank * nbytes[:, None] + b, 0)
        byte = torch.gather(sm_rows, 1, idx).to(torch.int64)
        word = word | torch.where(has, byte << (8 * b), 0)
    if info.dtype == torch.float32:
        sm = torch.where(low16[:, None], word << 16,
                         torch.where(lowbyte[:, None], word << 8, word))
    elif info.dtype == torch.float16:
        rem_rows = _gather_rows(payload, at[:, 2], rem_len, C * F.REM_BITS // 8)
        rem = unpack_bits(rem_rows, F.REM_BITS, C).to(torch.int64)
        rem = torch.gather(rem, 1, elem_rank.clamp(min=0))
        sm = word | (rem << 8)
    else:
        sm = word
    words = torch.where(coded[:, None], _join(e.clamp(0, info.emax), sm & ((2 << info.man_bits) - 1), info), word)
    words = torch.where(is_zero, torch.where(neg_zero, info.sign_word, 0), words)
    if info.dtype == torch.float32 and bool(lowbyte.any()):
        # Element i's bitmap bit; a set bit ORs the next byte of low into the word.
        width = (C + 7) // 8
        bit = unpack_bits(_gather_rows(payload, at[:, 2], rem_len, width), 1, 8 * width)[:, :C]
        bit = (bit != 0) & lowbyte[:, None] & valid
        low_rows = _gather_rows(payload, at[:, 4], low_len, C)
        byte = torch.gather(low_rows, 1, (torch.cumsum(bit, 1) - 1).clamp(min=0))
        words = words | torch.where(bit, byte.to(torch.int64), 0)
    flat = words.reshape(-1)[:numel]
    if info.itemsize == 2:
        flat = torch.where(flat >= 0x8000, flat - 0x10000, flat)
    else:
        flat = torch.where(flat >= 0x80000000, flat - 0x100000000, flat)
    flat_out.copy_(flat.to(flat_out.dtype))
    return out
