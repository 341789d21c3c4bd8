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


def _compact_rows(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Move each row's kept values to the row's front, in order; zeros after."""
    pos = torch.cumsum(keep, 1, dtype=torch.int64) - 1
    pos = torch.where(keep, pos, values.shape[1] - 1)
    out = torch.zeros_like(values)
    # Unkept entries all land on the last column; write kept ones after them.
    out.scatter_add_(1, pos, torch.where(keep, values, 0))
    return out


def _take_prefixes(rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Concatenate rows[c, :lengths[c]] over c."""
    cols = torch.arange(rows.shape[1], device=rows.device)
    return rows[cols[None, :] < lengths[:, None]]


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


def _dense_rank_lut(device) -> torch.Tensor:
    """(2 zero_first, 4 phase, 2*R+1 offset) -> rank, DENSE_ESC when absent."""
    lut = torch.full((2, 4, 2 * _R + 1), F.DENSE_ESC, dtype=torch.int64)
    for zf in range(2):
        for ph in range(4):
            for rank, sym in enumerate(F.dense_symbol_table(bool(zf), ph)):
                if sym != F.ZERO_SYMBOL:
                    lut[zf, ph, sym + _R] = rank
    return lut.to(device)


def _dense_sym_lut(device) -> torch.Tensor:
    """(2, 4, DENSE_SLOTS) -> offset, or ZERO_SYMBOL."""
    t = [[F.dense_symbol_table(bool(zf), ph) for ph in range(4)] for zf in range(2)]
    return torch.tensor(t, dtype=torch.int64, device=device)


_R = 64  # offsets from base are clamped into [-_R, _R]; the tables use |d| <= 6


# --------------------------------------------------------------------------
# Encode
# --------------------------------------------------------------------------
def encode(x: torch.Tensor, codec: str) -> torch.Tensor:
    info = F.dtype_info(x.dtype)
    numel = x.numel()
    dev = x.device
    C = F.CHUNK_ELEMS
    nch = F.nchunks_for(numel, C)
    header = F.Header(codec, x.dtype, tuple(x.shape), numel, C if codec != "raw" else 0,
                      nch if codec != "raw" else 0, 0, numel * info.itemsize, 0, 0)
    if codec == "raw" or numel == 0:
        if codec != "raw":
            header.sm_nbytes = 0
        head = header.to_tensor(dev)
        body = x.reshape(-1).view(torch.uint8) if codec == "raw" else head[:0]
        return torch.cat([head, body])

    W, valid = _words(x, info, nch, C)
    e, sm = _split(W, info)
    n = F.chunk_lengths(numel, nch, C, dev)
    base, phase = _locator(e, valid, info)
    is_zero = (W == 0) & valid
    nz = is_zero.sum(1, dtype=torch.int64)
    flags = torch.zeros_like(n)
    if info.dtype == torch.float32:
        low16 = (((W & 0xFFFF) == 0) | ~valid).all(1)
        flags |= torch.where(low16, F.FLAG_LOW16, 0)
    low16 = (flags & F.FLAG_LOW16) != 0
    zero_flag = torch.zeros_like(low16)

    if codec == "fixed3":
        zero_flag = (nz << F.FIXED_ZERO_SLOT_SHIFT) >= n
        lo_tab = torch.tensor([F.FIXED_LO, F.FIXED_LO_ZERO], device=dev)
        width = 7 - zero_flag.to(torch.int64)
        lo = (base + lo_tab[zero_flag.long(), phase]).clamp(min=0)
        lo = torch.minimum(lo, info.emax + 1 - width)
        d = e - lo[:, None]
        inwin = (d >= 0) & (d < width[:, None])
        zf = zero_flag[:, None]
        code = torch.where(inwin, d + zf.to(d.dtype), F.FIXED_ESC)
        omitted = zf & is_zero
        code = torch.where(omitted, 0, code)
        code = torch.where(valid, code, 0)
        esc = valid & (code == F.FIXED_ESC)
        n_open = torch.zeros(nch, 4, dtype=torch.int64, device=dev)
        nz = torch.where(zero_flag, nz, 0)
        code_rows = pack_bits(code, F.FIXED_BITS)  # (nch, 3C/8)
        code_len = F.packed_nbytes(n, F.FIXED_BITS)
        code_parts = [(code_rows, code_len)]
    else:
        zero_flag = (nz << F.DENSE_ZERO_FIRST_SHIFT) >= n
        zf = zero_flag.long()
        d = (e - base[:, None]).clamp(-_R, _R) + _R
        lut = _dense_rank_lut(dev)
        rank = lut[zf[:, None], phase[:, None], d]
        zero_rank = torch.where(zero_flag, 0, F.DENSE_SLOTS - 1)
        rank = torch.where(is_zero, zero_rank[:, None], rank)
        omitted = is_zero
        esc = valid & (rank == F.DENSE_ESC)
        code_parts = []
        opens = []
        for t, (bits, cap, start) in enumerate(zip(F.TIER_BITS, F.TIER_SYMBOLS, F.TIER_START)):
            open_t = valid & (rank >= start)
            if t:
                opens.append(open_t.sum(1, dtype=torch.int64))
            digit = (rank - start).clamp(max=cap)
            digits = _compact_rows(torch.where(open_t, digit, 0), open_t)
            cnt = opens[-1] if t else n
            code_parts.append((pack_bits(digits, bits), F.packed_nbytes(cnt, bits)))
        n_open = torch.stack(opens, 1)

    n_esc = esc.sum(1, dtype=torch.int64)
    table = F.ChunkTable(torch.full_like(n, F.MODE_CODED),
                         flags | torch.where(zero_flag, F.FLAG_ZERO, 0), base, phase,
                         nz, n_esc, n_open)
    seg = F.segment_nbytes(codec, info, n, table)
    coded = sum(seg) < n * info.itemsize
    raw_chunk = ~coded
    # Chunks that do not shrink are stored raw; their table entries are zero.
    z = torch.zeros_like(n)
    table = F.ChunkTable(torch.where(coded, F.MODE_CODED, F.MODE_RAW),
                         torch.where(coded, table.flags, z), torch.where(coded, base, z),
                         torch.where(coded, phase, z), torch.where(coded, table.n_zero, z),
                         torch.where(coded, n_esc, z), torch.where(coded[:, None], n_open, 0))
    codes_len, sm_len, rem_len, esc_len = F.segment_nbytes(codec, info, n, table)

    # codes: per chunk, each part's prefix, parts in order.
    rows = torch.cat([r for r, _ in code_parts], 1)
    lens = [torch.where(coded, ln, 0) for _, ln in code_parts]
    widths = [r.shape[1] for r, _ in code_parts]
    col_part_start = torch.tensor([sum(widths[:i]) for i in range(len(widths))], device=dev)
    cols = torch.arange(rows.shape[1], device=dev)
    part_of_col = torch.bucketize(cols, col_part_start, right=True) - 1
    lens_mat = torch.stack(lens, 1)  # (nch, parts)
    keep = (cols - col_part_start[part_of_col])[None, :] < lens_mat[:, part_of_col]
    codes_stream = rows[keep]

    # sm: coded chunks ship the kept elements' sm bytes; raw chunks their words.
    smb = torch.where(low16, 1, 3) if info.dtype == torch.float32 else torch.ones_like(n)
    if info.dtype == torch.float32:
        sm_val = torch.where(low16[:, None], sm >> 16, sm)
    elif info.dtype == torch.float16:
        sm_val = sm & 0xFF
    else:
        sm_val = sm
    value = torch.where(raw_chunk[:, None], W, sm_val)
    nbytes = torch.where(raw_chunk, info.itemsize, smb)
    elem_keep = valid & ~(coded[:, None] & omitted)
    byte_idx = torch.arange(4, device=dev)
    byte_keep = elem_keep[..., None] & (byte_idx < nbytes[:, None, None])
    vbytes = value.contiguous().view(torch.uint8).view(nch, C, 4)
    sm_stream = vbytes[byte_keep]

    # rem (fp16): top 3 bits of sm for kept elements of coded chunks.
    if info.dtype == torch.float16:
        keep_rem = elem_keep & coded[:, None]
        rem_vals = _compact_rows(torch.where(keep_rem, sm >> 8, 0), keep_rem)
        rem_stream = _take_prefixes(pack_bits(rem_vals, F.REM_BITS), rem_len)
    else:
        rem_stream = sm_stream[:0]

    esc_stream = e[esc & coded[:, None]].to(torch.uint8)

    header.codes_nbytes = int(codes_stream.numel())
    header.sm_nbytes = int(sm_stream.numel())
    header.rem_nbytes = int(rem_stream.numel())
    header.esc_nbytes = int(esc_stream.numel())
    head = header.to_tensor(dev)
    return torch.cat([head, table.to_bytes(), codes_stream, sm_stream, rem_stream, esc_stream])


# --------------------------------------------------------------------------
# Decode
# --------------------------------------------------------------------------
def _gather_segments(stream: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                     width: int) -> torch.Tensor:
    """(nch, width) uint8: row c holds stream[offsets[c] : offsets[c] + lengths[c]], zero-padded."""
    cols = torch.arange(width, device=stream.device)
    inside = cols[None, :] < lengths[:, None]
    idx = torch.where(inside, offsets[:, None] + cols[None, :], 0)
    if stream.numel() == 0:
        return torch.zeros(idx.shape, dtype=torch.uint8, device=stream.device)
    return torch.where(inside, stream[idx], 0)


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(x, 0) - x


def decode(payload: torch.Tensor, header: F.Header, out: torch.Tensor) -> torch.Tensor:
    info = F.DTYPES[header.dtype]
    dev = payload.device
    flat_out = out.reshape(-1).view(_INT_VIEW[info.itemsize])
    if header.codec == "raw":
        out.reshape(-1).view(torch.uint8).copy_(
            payload[header.streams_offset:header.streams_offset + header.sm_nbytes])
        return out
    numel, C, nch = header.numel, header.chunk_elems, header.nchunks
    if numel == 0:
        return out
    table = F.ChunkTable.from_bytes(payload[header.table_offset:header.streams_offset], nch)
    n = F.chunk_lengths(numel, nch, C, dev)
    F.validate_table(header.codec, info, n, table)
    seg = F.segment_nbytes(header.codec, info, n, table)
    want = (header.codes_nbytes, header.sm_nbytes, header.rem_nbytes, header.esc_nbytes)
    got = torch.stack([s.sum() for s in seg]).tolist()
    if tuple(got) != want:
        raise CorruptPayloadError(f"stream lengths {want} disagree with the chunk table {tuple(got)}")
    o = header.streams_offset
    streams = []
    for length in want:
        streams.append(payload[o:o + length])
        o += length
    codes_s, sm_s, rem_s, esc_s = streams
    codes_len, sm_len, rem_len, esc_len = seg
    coded = table.mode == F.MODE_CODED
    valid = (torch.arange(C, device=dev)[None, :] < n[:, None])
    low16 = (table.flags & F.FLAG_LOW16) != 0
    zero_flag = (table.flags & F.FLAG_ZERO) != 0
    base, phase = table.base, table.phase

    codes_off = _exclusive_cumsum(codes_len)
    if header.codec == "fixed3":
        rows = _gather_segments(codes_s, codes_off, codes_len, C * F.FIXED_BITS // 8)
        code = unpack_bits(rows, F.FIXED_BITS, C).to(torch.int64)
        zf = zero_flag[:, None]
        is_zero = zf & (code == 0)
        lo_tab = torch.tensor([F.FIXED_LO, F.FIXED_LO_ZERO], device=dev)
        width = 7 - zero_flag.to(torch.int64)
        lo = (base + lo_tab[zero_flag.long(), phase]).clamp(min=0)
        lo = torch.minimum(lo, info.emax + 1 - width)
        e = lo[:, None] + code - zf.to(torch.int64)
        esc = code == F.FIXED_ESC
    else:
        rank = torch.zeros(nch, C, dtype=torch.int64, device=dev)
        open_t = valid.clone()
        part_off = codes_off
        counts = torch.cat([n[:, None], table.n_open], 1)
        for t, (bits, cap) in enumerate(zip(F.TIER_BITS, F.TIER_SYMBOLS)):
            if t:
                got_open = open_t.sum(1)
                if bool((coded & (got_open != counts[:, t])).any()):
                    raise CorruptPayloadError(f"dense tier {t} open counts disagree with the table")
            ln = torch.where(coded, F.packed_nbytes(counts[:, t], bits), 0)
            rows = _gather_segments(codes_s, part_off, ln, C * bits // 8)
            part_off = part_off + ln
            digits = unpack_bits(rows, bits, C).to(torch.int64)
            pos = (torch.cumsum(open_t, 1) - 1).clamp(min=0)
            digit = torch.gather(digits, 1, pos)
            rank = rank + torch.where(open_t, digit, 0)
            open_t = open_t & (digit == cap)
        esc = open_t
        rank = rank.clamp(max=F.DENSE_SLOTS - 1)
        sym = _dense_sym_lut(dev)[zero_flag.long()[:, None], phase[:, None], rank]
        is_zero = (sym == F.ZERO_SYMBOL) & ~esc
        e = base[:, None] + sym

    esc = esc & valid & coded[:, None]
    is_zero = is_zero & valid & coded[:, None]
    if bool((coded & (esc.sum(1) != table.n_esc)).any()) or \
            bool((coded & (is_zero.sum(1) != table.n_zero)).any()):
        raise CorruptPayloadError("decoded escape/zero counts disagree with the chunk table")
    esc_off = _exclusive_cumsum(esc_len)
    esc_pos = esc_off[:, None] + torch.cumsum(esc, 1) - 1
    if esc_s.numel():
        esc_e = esc_s[torch.where(esc, esc_pos, 0)].to(torch.int64)
        e = torch.where(esc, esc_e, e)
    live = valid & coded[:, None] & ~is_zero
    if bool((live & ((e < 0) | (e > info.emax))).any()):
        raise CorruptPayloadError("a code decodes to an exponent outside the dtype")

    # sm bytes: kept elements of coded chunks, smb bytes each; raw chunks: words.
    smb = torch.where(low16, 1, 3) if info.dtype == torch.float32 else torch.ones_like(n)
    nbytes = torch.where(coded, smb, info.itemsize)
    elem_keep = valid & ~is_zero
    elem_rank = torch.cumsum(elem_keep, 1) - 1
    sm_off = _exclusive_cumsum(sm_len)
    word = torch.zeros(nch, C, dtype=torch.int64, device=dev)
    for b in range(max(info.itemsize, 3 if info.dtype == torch.float32 else 1)):
        has = elem_keep & (b < nbytes[:, None])
        if not bool(has.any()):
            continue
        idx = sm_off[:, None] + elem_rank * nbytes[:, None] + b
        byte = sm_s[torch.where(has, idx, 0)].to(torch.int64)
        word = word | torch.where(has, byte << (8 * b), 0)
    if info.dtype == torch.float32:
        sm = torch.where(low16[:, None], word << 16, word)
    elif info.dtype == torch.float16:
        rem_rows = _gather_segments(rem_s, _exclusive_cumsum(rem_len), rem_len, C * F.REM_BITS // 8)
        rem = unpack_bits(rem_rows, F.REM_BITS, C).to(torch.int64)
        rem = torch.gather(rem, 1, elem_rank.clamp(min=0))
        sm = word | (rem << 8)
    else:
        sm = word
    words = torch.where(coded[:, None], _join(e.clamp(0, info.emax), sm & ((2 << info.man_bits) - 1), info), word)
    words = torch.where(is_zero, 0, words)
    flat = words.reshape(-1)[:numel]
    if info.itemsize == 2:
        flat = torch.where(flat >= 0x8000, flat - 0x10000, flat)
    else:
        flat = torch.where(flat >= 0x80000000, flat - 0x100000000, flat)
    flat_out.copy_(flat.to(flat_out.dtype))
    return out
