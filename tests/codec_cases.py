"""Inputs every codec backend is tested on: special bit patterns, not just randn.

Tests compare integer views (``bits``), never float values: NaN != NaN and
-0.0 == +0.0 would hide exactly the bugs a lossless codec must not have.
"""
import torch

INT_VIEW = {2: torch.int16, 4: torch.int32}
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SIZES = (0, 1, 7, 4097, 3 * 4096 + 5)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(INT_VIEW[t.element_size()])


def from_bits(words, dtype) -> torch.Tensor:
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return torch.tensor(words, dtype=torch.int64).to(INT_VIEW[itemsize]).view(dtype)


def special_words(dtype) -> list:
    """NaNs with several payloads, infinities, signed zeros, subnormals, extremes."""
    if dtype == torch.float32:
        return [0x7FC00000, 0x7F800001, 0xFFC12345, 0x7FFFFFFF, 0x7F800000, 0xFF800000,
                0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF,
                0x00800000, 0x3F800000]
    if dtype == torch.float16:
        return [0x7E00, 0x7C01, 0xFE55, 0x7FFF, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001,
                0x83FF, 0x7BFF, 0xFBFF, 0x0400, 0x3C00]
    return [0x7FC0, 0x7F81, 0xFFC5, 0x7FFF, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001,
            0x807F, 0x7F7F, 0xFF7F, 0x0080, 0x3F80]


def signed(words, itemsize):
    lim = 1 << (8 * itemsize)
    return [w - lim if w >= lim // 2 else w for w in words]


def case(name: str, n: int, dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if name == "gauss":
        return torch.randn(n, generator=g).to(dtype)
    if name == "tiny_sigma":
        return (torch.randn(n, generator=g) * 3e-4).to(dtype)
    if name == "special":
        x = torch.randn(n, generator=g).to(dtype)
        sp = from_bits(signed(special_words(dtype), itemsize), dtype)
        idx = torch.randint(0, max(n, 1), (min(n, 4 * len(sp)),), generator=g)
        if n:
            x[idx] = sp.repeat(4)[: idx.numel()]
        return x
    if name == "random_bits":
        lo, hi = -(1 << (8 * itemsize - 1)), 1 << (8 * itemsize - 1)
        return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(
            INT_VIEW[itemsize]).view(dtype)
    if name == "zero_heavy":
        x = torch.randn(n, generator=g).to(dtype)
        x[torch.rand(n, generator=g) < 0.6] = 0
        return x
    if name == "all_zero":
        return torch.zeros(n, dtype=dtype)
    if name == "masked_mul":  # x * mask: -0.0 where x < 0, +0.0 where x > 0, NaN payloads kept
        x = torch.randn(n, generator=g).to(dtype)
        x = x * (torch.rand(n, generator=g) >= 0.3).to(dtype)
        sp = from_bits(signed(special_words(dtype)[:4], itemsize), dtype)
        if n:
            x[torch.randint(0, n, (min(n, 8),), generator=g)] = sp.repeat(2)[:min(n, 8)]
        return x
    if name == "neg_zero_heavy":
        x = torch.randn(n, generator=g).to(dtype)
        x[torch.rand(n, generator=g) < 0.6] = -0.0
        return x
    if name == "bf16_casts":
        return torch.randn(n, generator=g).bfloat16().to(dtype)
    if name == "subnormal":
        tiny = torch.finfo(dtype).tiny
        return (torch.randn(n, generator=g, dtype=torch.float64) * tiny).to(dtype)
    if name == "mantissa_tail":
        # fp32 sums of 2-4 bf16 values (mantissas end in many zero bits:
        # LOWBYTE chunks), with specials, subnormals and x * mask zeros.
        x = mantissa_tail(n, g)
        x = x * (torch.rand(n, generator=g) >= 0.1).float()
        words = signed(special_words(torch.float32) + [0x00000100, 0x80000300], 4)
        if n:
            x[torch.randint(0, n, (min(n, 32),), generator=g)] = from_bits(
                words, torch.float32).repeat(3)[:min(n, 32)]
        return x.to(dtype)
    if name == "tail_mixed":
        # Chunks of mantissa tails (LOWBYTE), Gaussian fp32 (not), bf16 casts
        # (LOW16) and tails again, in one tensor.
        x = mantissa_tail(n, g)
        for k, part in ((1, torch.randn(4096, generator=g)),
                        (2, torch.randn(4096, generator=g).bfloat16().float())):
            x[4096 * k:4096 * (k + 1)] = part[:max(0, min(4096, n - 4096 * k))]
        return x.to(dtype)
    if name == "zero_runs":
        # Whole chunks of +0.0 (ZERO chunks, as an embedding gradient's unused
        # rows make) beside chunks that are +0.0 but for one -0.0, one NaN or
        # one subnormal (not ZERO), and an all-+0.0 ragged tail.
        x = torch.randn(n, generator=g).to(dtype)
        odd = from_bits(signed([special_words(dtype)[k] for k in (7, 0, 8)], itemsize), dtype)
        for c in range(0, -(-n // 4096)):
            part = x[4096 * c:4096 * (c + 1)]
            if c % 4 == 0 or c == (n - 1) // 4096:
                part.zero_()
            elif c % 4 == 1:
                part.zero_()
                part[(37 * c) % part.numel()] = odd[c % 3]
        return x
    raise KeyError(name)


def mantissa_tail(n: int, g: torch.Generator, sigma: float = 1e-3) -> torch.Tensor:
    """fp32 sums of 2 to 4 bf16 values (an fp32 gradient accumulated from bf16
    partial ones): not bf16 casts, but most low mantissa bytes are zero."""
    terms = torch.randint(2, 5, (n,), generator=g)
    acc = torch.zeros(n)
    for t in range(4):
        part = (torch.randn(n, generator=g) * sigma).bfloat16().float()
        acc += torch.where(terms > t, part, 0.0)
    return acc


CASES = ("gauss", "tiny_sigma", "special", "random_bits", "zero_heavy", "all_zero",
         "bf16_casts", "subnormal", "masked_mul", "neg_zero_heavy", "mantissa_tail",
         "tail_mixed", "zero_runs")
