// The C++ CPU backend of the zipccl payload format (see zipccl_fsdp/format.py,
// the only definition of the format, and codec_torch.py, the reference this
// file must match byte for byte).
//
// Encode runs two passes over chunks, each an OpenMP loop over chunks:
//   pass 1 reads a chunk and decides its table entry (locator, flags, counts),
//          hence its padded segment size; a prefix sum over the nchunks sizes
//          gives every segment's offset in the chunk-major body;
//   pass 2 reads the chunk again and writes its segment (codes | sm | rem |
//          esc | low, each 16-byte aligned, padding zeroed) straight into
//          the payload Python allocated from pass 1's body size.
// Decode checks every entry and offset against the table (no trust in the
// offsets, but no scan needed to find a chunk either) and decodes every chunk
// straight into `out` in one parallel pass.
// With verify, pass 2 and the decode pass also compute each chunk's checksum
// (format.py, "Integrity") while the chunk is in cache; codec.py compares them.
// Nothing here throws: decode errors come back as (chunk << 8) | code and
// codec_cpp.py raises CorruptPayloadError. entry_ok() applies the rules of
// format.validate_table to every entry before anything is read.
//
// Three kernel sets, picked per call: generic scalar code (any CPU; also the
// n % 32 tails of the others), and two builds of one set of 32-element block
// kernels: AVX2 + BMI2, and the same source for AVX-512 BW/VL/VBMI2, where
// vpcompressb/vpexpandb move the bytes that omitted zeros and escapes leave
// out (and a few steps take 512-bit vectors: see the VBMI2 pass below). The
// library is built for baseline x86-64 (the .so may be reused on another
// machine); the block kernels carry their own target attribute and run only
// after a run-time CPU check.
//
// The second build of the block kernels is codec_vbmi2.cpp, a translation
// unit of its own that includes this file with ZIPCCL_VBMI2_PASS set: it
// compiles the block-kernel section under another target and namespace (and
// the code before it, which the kernels use), and exports the kernels as
// vbmi2::*; so both builds come from one text. A translation unit shared
// with the AVX2 build made GCC compile that build into slower code.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "zipccl's C++ codec assumes a little-endian host (the format is little-endian)"
#endif

namespace zipccl {

// --------------------------------------------------------------------------
// Format constants (mirrors of format.py; codec_cpp.py compares them with
// format.py at load time and refuses the extension if they ever drift).
// --------------------------------------------------------------------------
constexpr int kChunkElems = 4096;
constexpr int kEntryBytes = 16, kOffsetBytes = 4, kAlign = 16;
constexpr int kModeRaw = 0, kModeCoded = 1, kModeZero = 2;
constexpr int kFlagLow16 = 1, kFlagZpos = 2, kFlagZneg = 4, kFlagLowbyte = 8;
constexpr int kFixedZeroShift = 6, kDenseZeroShift = 5;
constexpr int kFixedBits = 3, kFixedEsc = 7, kRemBits = 3;
constexpr int kTierBits[5] = {2, 1, 1, 2, 2};
constexpr int kTierSymbols[5] = {3, 1, 1, 3, 3};  // all-ones digit: continue
constexpr int kDenseSlots = 11, kDenseEsc = 11, kZeroSymbol = 127, kNegZeroSymbol = 126;
constexpr int8_t kDenseOrder[4][10] = {
    {1, 0, 2, -1, -2, -3, -4, -5, 3, -6},
    {1, 2, 0, -1, -2, -3, 3, -4, -5, -6},
    {1, 2, 0, -1, 3, -2, -3, -4, -5, -6},
    {2, 1, 0, 3, -1, -2, -3, -4, -5, -6},
};
constexpr int8_t kFixedLo[3][4] = {{-4, -3, -3, -3}, {-3, -3, -2, -2}, {-2, -2, -1, -1}};  // [zero codes][phase]
enum Codec { kRaw = 0, kFixed3 = 1, kDense = 2 };
// Integrity checksums (format.py, "Integrity"): per run of kChunkElems input
// elements, the sum mod 2**32 of mix(word_i ^ key_i), key_i = (i | code << 16)
// * kSumKeyMul, mix: h *= kSumMul1; h ^= h >> 15; h *= kSumMul2; h ^= h >> 16.
constexpr uint32_t kSumKeyMul = 0x1E3779B1u, kSumMul1 = 0x2C1B3C6Du, kSumMul2 = 0x297A2D39u;

// Decode error codes (codec_cpp.py turns them into messages).
enum Err {
  kOk = 0,
  kErrTable = 1,     // table entry the Python validation should have refused
  kErrLengths = 2,   // stream lengths disagree with the table
  kErrOpen = 3,      // dense tier open counts disagree with the table
  kErrCounts = 4,    // decoded escape/zero counts disagree with the table
  kErrExponent = 5,  // a code decodes to an exponent outside the dtype
  kErrOffsets = 6,   // a segment offset disagrees with the table
  kErrPadding = 7,   // a padding byte after a sub-stream is not zero
  kErrGap = 8,       // a padding byte after the segment offsets is not zero
};

// One chunk-table entry, exactly its 16 wire bytes on a little-endian host.
struct Entry {
  uint8_t mode, flags, base, phase;
  uint16_t n_zero, n_esc, n_open[4];
};
static_assert(sizeof(Entry) == kEntryBytes, "chunk entry must be 16 bytes");

struct Seg {
  int64_t codes, sm, rem, esc, low;
};

static inline int64_t packed_nbytes(int64_t count, int bits) { return (count * bits + 7) >> 3; }

// Element fields of one dtype. W is the unsigned word, CODE format.py's dtype code.
template <typename W_, int EXP, int MAN, int CODE>
struct DT {
  using W = W_;
  static constexpr int kCode = CODE;
  static constexpr int kItem = sizeof(W);
  static constexpr int kExp = EXP, kMan = MAN;
  static constexpr uint32_t kEmax = (1u << EXP) - 1;
  static constexpr uint32_t kManMask = (1u << MAN) - 1;
  static constexpr bool kF32 = sizeof(W) == 4;
  static constexpr bool kF16 = sizeof(W) == 2 && EXP == 5;
  static constexpr uint32_t kSign = 1u << (8 * sizeof(W) - 1);  // the word of -0.0
  static inline uint32_t exp(uint32_t w) { return (w >> MAN) & kEmax; }
  static inline uint32_t sm(uint32_t w) { return (((w >> (MAN + EXP)) & 1u) << MAN) | (w & kManMask); }
  static inline uint32_t join(uint32_t e, uint32_t sm) {
    return (((sm >> MAN) & 1u) << (MAN + EXP)) | (e << MAN) | (sm & kManMask);
  }
};
using BF16 = DT<uint16_t, 8, 7, 1>;
using FP16 = DT<uint16_t, 5, 10, 2>;
using FP32 = DT<uint32_t, 8, 23, 3>;

static inline int64_t align16(int64_t x) { return (x + 15) & ~int64_t(15); }

// format.lowbyte_wins: LOWBYTE makes the padded segment of a chunk of n
// elements, kept of them shipping sm and n_low with a nonzero low byte,
// strictly smaller.
static inline bool lowbyte_wins(int64_t n, int64_t kept, int64_t n_low) {
  return align16(2 * kept) + align16((n + 7) / 8) + align16(n_low) < align16(3 * kept);
}

// n_low: the set bits of a LOWBYTE chunk's bitmap (its low length).
template <class T>
static inline Seg segment_nbytes(int codec, const Entry& en, int64_t n, int64_t n_low = 0) {
  if (en.mode != kModeCoded) return {0, en.mode == kModeRaw ? n * T::kItem : 0, 0, 0, 0};
  int64_t codes;
  if (codec == kFixed3) {
    codes = packed_nbytes(n, kFixedBits);
  } else {
    codes = packed_nbytes(n, kTierBits[0]);
    for (int t = 1; t < 5; ++t) codes += packed_nbytes(en.n_open[t - 1], kTierBits[t]);
  }
  const int64_t kept = n - en.n_zero;
  if (T::kF32 && (en.flags & kFlagLowbyte)) return {codes, 2 * kept, (n + 7) / 8, en.n_esc, n_low};
  const int64_t smb = T::kF32 ? ((en.flags & kFlagLow16) ? 1 : 3) : 1;
  return {codes, kept * smb, T::kF16 ? packed_nbytes(kept, kRemBits) : 0, en.n_esc, 0};
}

// Lowest exponent of the fixed3 window and its width.
template <class T>
static inline void fixed_window(int base, int phase, int z, int* lo, int* width) {
  const int w = 7 - z;
  int l = base + kFixedLo[z][phase];
  l = std::max(l, 0);
  l = std::min(l, int(T::kEmax) + 1 - w);
  *lo = l;
  *width = w;
}

// fixed3 zero codes of a chunk: how many, and the code of +0.0 / -0.0 (-1: none).
struct Zeros {
  int z, cpos, cneg;
};
static inline Zeros fixed_zeros(int flags) {
  const int zp = (flags & kFlagZpos) ? 1 : 0, zn = (flags & kFlagZneg) ? 1 : 0;
  return {zp + zn, zp - 1, zn * (zp + 1) - 1};
}

// Dense rank of an exponent offset d = e - base + 8, in [0, 16): symbol rank,
// kDenseEsc when the offset is not in the order table. Zero symbols not here:
// zrank holds the ranks of +0.0 and -0.0 (-1: no symbol). Indexed
// [zpos][zneg][phase] (format.dense_symbol_table).
struct DenseLuts {
  uint8_t rank[2][2][4][16];
  int8_t sym[2][2][4][kDenseSlots];  // rank -> offset, kZeroSymbol or kNegZeroSymbol
  int8_t zrank[2][2][4][2];
  DenseLuts() {
    for (int zp = 0; zp < 2; ++zp)
      for (int zn = 0; zn < 2; ++zn)
        for (int ph = 0; ph < 4; ++ph) {
          int8_t all[kDenseSlots + 3];
          int k = 0;
          if (zp) all[k++] = kZeroSymbol;
          if (zn) all[k++] = kNegZeroSymbol;
          for (int j = 0; j < 10; ++j) all[k++] = kDenseOrder[ph][j];
          if (!zp) all[k++] = kZeroSymbol;
          for (int d = 0; d < 16; ++d) rank[zp][zn][ph][d] = kDenseEsc;
          zrank[zp][zn][ph][0] = zrank[zp][zn][ph][1] = -1;
          for (int r = 0; r < kDenseSlots; ++r) {
            const int8_t s = all[r];
            sym[zp][zn][ph][r] = s;
            if (s == kZeroSymbol)
              zrank[zp][zn][ph][0] = int8_t(r);
            else if (s == kNegZeroSymbol)
              zrank[zp][zn][ph][1] = int8_t(r);
            else
              rank[zp][zn][ph][s + 8] = uint8_t(r);
          }
        }
  }
};
static const DenseLuts kLuts;

// --------------------------------------------------------------------------
// Bit streams: value i of a stream occupies bits [b*i, b*(i+1)), LSB first.
// Writers touch exactly ceil(bits/8) bytes and readers read nothing past
// their segment: segments of other chunks are written concurrently, and a
// payload ends where it ends.
// --------------------------------------------------------------------------
struct BitWriter {
  uint8_t* p = nullptr;
  uint64_t buf = 0;
  int nb = 0;  // pending bits in buf, < 32 between calls
  BitWriter() = default;
  explicit BitWriter(uint8_t* dst) : p(dst) {}
  // v < 2**bits, bits <= 32.
  inline void put(uint64_t v, int bits) {
    buf |= v << nb;
    nb += bits;
    if (nb >= 32) {
      const uint32_t lo = uint32_t(buf);
      std::memcpy(p, &lo, 4);
      p += 4;
      buf >>= 32;
      nb -= 32;
    }
  }
  inline void put64(uint64_t v, int bits) {
    if (bits > 32) {
      put(v & 0xFFFFFFFFu, 32);
      put(v >> 32, bits - 32);
    } else {
      put(v, bits);
    }
  }
  inline void finish() {
    for (; nb > 0; nb -= 8) {
      *p++ = uint8_t(buf);
      buf >>= 8;
    }
  }
};

struct BitReader {
  const uint8_t* p = nullptr;
  const uint8_t* end = nullptr;
  uint64_t buf = 0;  // bits [0, nb) are the next bits of the stream
  int nb = 0;
  BitReader() = default;
  BitReader(const uint8_t* src, int64_t len) : p(src), end(src + len) {}
  inline void refill() {
    if (end - p >= 8) {
      uint64_t v;
      std::memcpy(&v, p, 8);
      buf |= v << nb;  // bits past the claimed bytes are the stream's next bits too
      const int take = (63 - nb) >> 3;
      p += take;
      nb += 8 * take;
    } else {
      for (; nb <= 56 && p < end; nb += 8) buf |= uint64_t(*p++) << nb;
    }
  }
  // The next `bits` (<= 32) bits; zeros past the end (callers bound their
  // reads by the table's counts, so that only happens on corrupt input).
  inline uint32_t get(int bits) {
    if (nb < bits) refill();
    const uint32_t v = uint32_t(buf & ((uint64_t(1) << bits) - 1));
    buf >>= bits;
    nb = std::max(nb - bits, 0);
    return v;
  }
  inline uint64_t get64(int bits) {
    if (bits <= 32) return get(bits);
    const uint64_t lo = get(32);
    return lo | (uint64_t(get(bits - 32)) << 32);
  }
};

// --------------------------------------------------------------------------
// Chunk analysis shared by every path
// --------------------------------------------------------------------------
// Locator from the exponent sum S and count K of normal elements.
static inline void set_locator(Entry& en, uint64_t S, uint64_t K) {
  const uint64_t q = K ? (4 * S) / K : 0;
  en.base = uint8_t(q >> 2);
  en.phase = uint8_t(q & 3);
}

// The chunk's LOWBYTE flag by format.py's rule, from its count of elements
// with a nonzero low byte (fp32, not LOW16), then mode RAW with
// every field zero when coding would not shrink the chunk's padded segment
// (format.py: CODED only when smaller than the padded raw bytes). *n_low:
// the chunk's low length.
template <class T>
static inline Entry lowbyte_or_raw(Entry en, int codec, int n, int64_t low8, int* n_low) {
  *n_low = 0;
  if (T::kF32 && !(en.flags & kFlagLow16) && lowbyte_wins(n, n - en.n_zero, low8)) {
    en.flags |= kFlagLowbyte;
    *n_low = int(low8);
  }
  const Seg s = segment_nbytes<T>(codec, en, n, *n_low);
  if (align16(s.codes) + align16(s.sm) + align16(s.rem) + align16(s.esc) + align16(s.low) <
      align16(int64_t(n) * T::kItem))
    return en;
  *n_low = 0;
  return Entry{};
}

template <class T>
static inline int dense_rank(uint32_t w, int base, const uint8_t* lut, int rpos, int rneg) {
  if (w == 0 && rpos >= 0) return rpos;
  if (w == T::kSign && rneg >= 0) return rneg;
  const int d = int(T::exp(w)) - base + 8;
  return unsigned(d) < 16u ? lut[d] : kDenseEsc;
}

// --------------------------------------------------------------------------
// Generic (scalar) kernels. They are the whole codec on CPUs without AVX2 and
// the tails (n % 32 elements) of the AVX2 kernels, so they work on element
// ranges [i0, n) with stream state passed in.
// --------------------------------------------------------------------------
struct EncOut {
  uint8_t* sm;
  BitWriter rem;
  uint8_t* esc;
};

// LOWBYTE's bitmap byte of m <= 8 fp32 words w (bit q: the low byte of w[q]
// is not zero) at *bm, and those low bytes, in order, at lp; returns their end.
static inline uint8_t* low_row(const uint32_t* w, int64_t m, uint8_t* bm, uint8_t* lp) {
  uint32_t bits = 0;
  for (int64_t q = 0; q < m; ++q) {
    const uint8_t b = uint8_t(w[q]);
    if (b) {
      bits |= 1u << q;
      *lp++ = b;
    }
  }
  *bm = uint8_t(bits);
  return lp;
}

template <class T>
static inline void emit_sm(uint32_t x, bool low16, EncOut& o) {
  const uint32_t v = T::sm(x);
  if (T::kF32) {
    if (low16) {
      *o.sm++ = uint8_t(v >> 16);
    } else {
      o.sm[0] = uint8_t(v);
      o.sm[1] = uint8_t(v >> 8);
      o.sm[2] = uint8_t(v >> 16);
      o.sm += 3;
    }
  } else {
    *o.sm++ = uint8_t(v);
    if (T::kF16) o.rem.put(v >> 8, kRemBits);
  }
}

template <class T>
static inline void fixed3_encode_range(const typename T::W* w, int i0, int n, int lo, int width,
                                       const Zeros& zc, bool low16, BitWriter& cw, EncOut& o) {
  for (int i = i0; i < n; ++i) {
    const uint32_t x = w[i];
    if (zc.cpos >= 0 && x == 0) {
      cw.put(uint32_t(zc.cpos), kFixedBits);
      continue;
    }
    if (zc.cneg >= 0 && x == T::kSign) {
      cw.put(uint32_t(zc.cneg), kFixedBits);
      continue;
    }
    const uint32_t e = T::exp(x);
    const uint32_t d = e - uint32_t(lo);
    const uint32_t code = d < uint32_t(width) ? d + uint32_t(zc.z) : kFixedEsc;
    cw.put(code, kFixedBits);
    if (code == kFixedEsc) *o.esc++ = uint8_t(e);
    emit_sm<T>(x, low16, o);
  }
}

template <class T>
static inline void dense_encode_range(const typename T::W* w, int i0, int n, int base,
                                      const uint8_t* lut, int rpos, int rneg, bool low16,
                                      BitWriter* tw, EncOut& o) {
  for (int i = i0; i < n; ++i) {
    const uint32_t x = w[i];
    const int r = dense_rank<T>(x, base, lut, rpos, rneg);
    tw[0].put(std::min(r, 3), 2);
    if (r >= 3) {
      tw[1].put(r > 3, 1);
      if (r >= 4) {
        tw[2].put(r > 4, 1);
        if (r >= 5) {
          tw[3].put(std::min(r - 5, 3), 2);
          if (r >= 8) tw[4].put(r - 8, 2);
        }
      }
    }
    if (r == rpos || r == rneg) continue;  // no sm for a coded zero
    if (r == kDenseEsc) *o.esc++ = uint8_t(T::exp(x));
    emit_sm<T>(x, low16, o);
  }
}

template <class T>
static Entry analyze_chunk(const typename T::W* w, int n, int codec, int* n_low) {
  uint64_t S = 0;
  uint32_t K = 0, npos = 0, nneg = 0, low = 0, low8 = 0;
  for (int i = 0; i < n; ++i) {
    const uint32_t x = w[i];
    const uint32_t e = T::exp(x);
    const bool normal = (e - 1u) < (T::kEmax - 1u);
    S += normal ? e : 0;
    K += normal;
    npos += x == 0;
    nneg += x == T::kSign;
    if (T::kF32) low |= x & 0xFFFFu;
    if (T::kF32) low8 += (x & 0xFFu) != 0;
  }
  Entry en{};
  if (int64_t(npos) == n) {  // every element +0.0: a ZERO chunk, its entry zeros
    *n_low = 0;
    en.mode = kModeZero;
    return en;
  }
  en.mode = kModeCoded;
  set_locator(en, S, K);
  if (T::kF32 && low == 0) en.flags |= kFlagLow16;
  const int shift = codec == kFixed3 ? kFixedZeroShift : kDenseZeroShift;
  const bool zp = (int64_t(npos) << shift) >= n, zn = (int64_t(nneg) << shift) >= n;
  en.flags |= (zp ? kFlagZpos : 0) | (zn ? kFlagZneg : 0);
  if (codec == kFixed3) {
    const Zeros zc = fixed_zeros(en.flags);
    int lo, width;
    fixed_window<T>(en.base, en.phase, zc.z, &lo, &width);
    uint32_t nesc = 0;
    for (int i = 0; i < n; ++i) {
      const uint32_t x = w[i];
      const bool zero = (zp && x == 0) || (zn && x == T::kSign);
      nesc += (T::exp(x) - uint32_t(lo)) >= uint32_t(width) && !zero;
    }
    en.n_zero = uint16_t((zp ? npos : 0) + (zn ? nneg : 0));
    en.n_esc = uint16_t(nesc);
  } else {
    const uint8_t* lut = kLuts.rank[zp][zn][en.phase];
    const int rpos = kLuts.zrank[zp][zn][en.phase][0], rneg = kLuts.zrank[zp][zn][en.phase][1];
    uint32_t cnt[5] = {0, 0, 0, 0, 0};  // rank >= 3, 4, 5, 8, == ESC
    for (int i = 0; i < n; ++i) {
      const int r = dense_rank<T>(w[i], en.base, lut, rpos, rneg);
      cnt[0] += r >= 3;
      cnt[1] += r >= 4;
      cnt[2] += r >= 5;
      cnt[3] += r >= 8;
      cnt[4] += r == kDenseEsc;
    }
    en.n_zero = uint16_t((rpos >= 0 ? npos : 0) + (rneg >= 0 ? nneg : 0));
    en.n_esc = uint16_t(cnt[4]);
    for (int t = 0; t < 4; ++t) en.n_open[t] = uint16_t(cnt[t]);
  }
  return lowbyte_or_raw<T>(en, codec, n, low8, n_low);
}

// Segment starts of the dense tiers inside a chunk's codes segment.
static inline void dense_tier_segments(const Entry& en, int n, int64_t start[5], int64_t len[5]) {
  const int64_t count[5] = {n, en.n_open[0], en.n_open[1], en.n_open[2], en.n_open[3]};
  int64_t at = 0;
  for (int t = 0; t < 5; ++t) {
    start[t] = at;
    len[t] = packed_nbytes(count[t], kTierBits[t]);
    at += len[t];
  }
}

template <class T>
static void write_chunk(const typename T::W* w, int n, int codec, const Entry& en,
                        uint8_t* codes, uint8_t* sm, uint8_t* rem, uint8_t* esc) {
  if (en.mode != kModeCoded) {  // RAW: the words; ZERO: nothing
    if (en.mode == kModeRaw) std::memcpy(sm, w, size_t(n) * T::kItem);
    return;
  }
  const bool zp = en.flags & kFlagZpos, zn = en.flags & kFlagZneg;
  const bool low16 = en.flags & kFlagLow16;
  EncOut o{sm, BitWriter(rem), esc};
  if (codec == kFixed3) {
    const Zeros zc = fixed_zeros(en.flags);
    int lo, width;
    fixed_window<T>(en.base, en.phase, zc.z, &lo, &width);
    BitWriter cw(codes);
    fixed3_encode_range<T>(w, 0, n, lo, width, zc, low16, cw, o);
    cw.finish();
  } else {
    int64_t start[5], len[5];
    dense_tier_segments(en, n, start, len);
    BitWriter tw[5];
    for (int t = 0; t < 5; ++t) tw[t] = BitWriter(codes + start[t]);
    dense_encode_range<T>(w, 0, n, en.base, kLuts.rank[zp][zn][en.phase],
                          kLuts.zrank[zp][zn][en.phase][0], kLuts.zrank[zp][zn][en.phase][1],
                          low16, tw, o);
    for (auto& t : tw) t.finish();
  }
  o.rem.finish();
}

// Decode-side stream state of one chunk. Every read is bounded: sm by the
// kept count the table implies, esc by n_esc.
struct DecIn {
  const uint8_t* sm;
  const uint8_t* sm_end;
  BitReader rem;
  const uint8_t* esc;
  const uint8_t* esc_end;
  const uint8_t* end;  // end of the payload: bound of the AVX2 kernels' sloppy loads
  int n_zero = 0;
  // Bound of their sloppy loads from sm: the payload's end, or the end of
  // the buffer a LOWBYTE chunk's sm groups are merged into.
  const uint8_t* sm_lim = nullptr;
  bool omits = false;  // the chunk codes zeros without sm (n_zero > 0; see load_all)
};

template <class T>
static inline int read_esc(DecIn& in, uint32_t* e) {
  if (in.esc == in.esc_end) return kErrCounts;
  *e = *in.esc++;
  return *e > T::kEmax ? kErrExponent : kOk;
}

// Word of a live element with exponent e (in range), reading its sm.
template <class T>
static inline int emit_word(DecIn& in, uint32_t e, bool low16, typename T::W* out) {
  uint32_t sm;
  if (T::kF32 && !low16) {
    if (in.sm_end - in.sm < 3) return kErrCounts;
    sm = uint32_t(in.sm[0]) | (uint32_t(in.sm[1]) << 8) | (uint32_t(in.sm[2]) << 16);
    in.sm += 3;
  } else {
    if (in.sm == in.sm_end) return kErrCounts;
    sm = *in.sm++;
    if (T::kF32) sm <<= 16;
    if (T::kF16) sm |= in.rem.get(kRemBits) << 8;
  }
  *out = typename T::W(T::join(e, sm));
  return kOk;
}

template <class T>
static inline int dense_emit(int r, int base, const int8_t* sym, bool low16, DecIn& in,
                             typename T::W* out) {
  uint32_t e;
  if (r == kDenseEsc) {
    if (int err = read_esc<T>(in, &e)) return err;
  } else {
    const int s = sym[r];
    if (s == kZeroSymbol || s == kNegZeroSymbol) {
      *out = typename T::W(s == kZeroSymbol ? 0u : T::kSign);
      ++in.n_zero;
      return kOk;
    }
    const int ee = base + s;
    if (ee < 0 || ee > int(T::kEmax)) return kErrExponent;
    e = uint32_t(ee);
  }
  return emit_word<T>(in, e, low16, out);
}

template <class T>
static inline int fixed3_decode_range(int i0, int n, int lo, const Zeros& zc, bool low16,
                                      BitReader& cr, DecIn& in, typename T::W* out) {
  for (int i = i0; i < n; ++i) {
    const uint32_t code = cr.get(kFixedBits);
    if (code < uint32_t(zc.z)) {
      out[i] = typename T::W(int(code) == zc.cneg ? T::kSign : 0u);
      ++in.n_zero;
      continue;
    }
    uint32_t e;
    if (code == kFixedEsc) {
      if (int err = read_esc<T>(in, &e)) return err;
    } else {
      e = uint32_t(lo) + code - uint32_t(zc.z);
    }
    if (int err = emit_word<T>(in, e, low16, out + i)) return err;
  }
  return kOk;
}

// left[t]: digits of tier t+1 not read yet (the table's n_open minus reads).
template <class T>
static inline int dense_decode_range(int i0, int n, int base, const int8_t* sym, bool low16,
                                     BitReader* tr, int* left, DecIn& in, typename T::W* out) {
  for (int i = i0; i < n; ++i) {
    uint32_t d = tr[0].get(2);
    int r = int(d);
    for (int t = 1; t < 5 && d == uint32_t(kTierSymbols[t - 1]); ++t) {
      if (left[t - 1]-- == 0) return kErrOpen;
      d = tr[t].get(kTierBits[t]);
      r += int(d);
    }
    if (int err = dense_emit<T>(r, base, sym, low16, in, out + i)) return err;
  }
  return kOk;
}

// Chunk-level checks every decode path ends with.
static inline int dense_tail_checks(const int* left) {
  return (left[0] | left[1] | left[2] | left[3]) ? kErrOpen : kOk;
}
static inline int count_checks(const DecIn& in, const Entry& en) {
  return (in.n_zero != en.n_zero || in.esc != in.esc_end) ? kErrCounts : kOk;
}

template <class T>
static int decode_chunk_generic(int codec, const Entry& en, int n, const uint8_t* codes,
                                DecIn& in, typename T::W* out) {
  const bool zp = en.flags & kFlagZpos, zn = en.flags & kFlagZneg;
  const bool low16 = en.flags & kFlagLow16;
  if (codec == kFixed3) {
    const Zeros zc = fixed_zeros(en.flags);
    int lo, width;
    fixed_window<T>(en.base, en.phase, zc.z, &lo, &width);
    BitReader cr(codes, packed_nbytes(n, kFixedBits));
    if (int err = fixed3_decode_range<T>(0, n, lo, zc, low16, cr, in, out)) return err;
  } else {
    int64_t start[5], len[5];
    dense_tier_segments(en, n, start, len);
    BitReader tr[5];
    for (int t = 0; t < 5; ++t) tr[t] = BitReader(codes + start[t], len[t]);
    int left[4] = {en.n_open[0], en.n_open[1], en.n_open[2], en.n_open[3]};
    if (int err = dense_decode_range<T>(0, n, en.base, kLuts.sym[zp][zn][en.phase], low16, tr, left,
                                        in, out))
      return err;
    if (int err = dense_tail_checks(left)) return err;
  }
  return count_checks(in, en);
}

// The checksum of one run, over elements [i0, n) of it (i counts from the
// run's start); the whole sum on CPUs without AVX2, the n % 16 tail otherwise.
static inline uint32_t sum_mix(uint32_t h) {
  h *= kSumMul1;
  h ^= h >> 15;
  h *= kSumMul2;
  return h ^ (h >> 16);
}

template <class T>
static uint32_t run_sum_generic(const typename T::W* w, int i0, int n) {
  uint32_t s = 0;
  for (int i = i0; i < n; ++i)
    s += sum_mix(uint32_t(w[i]) ^ ((uint32_t(i) | uint32_t(T::kCode) << 16) * kSumKeyMul));
  return s;
}

// --------------------------------------------------------------------------
// AVX2 + BMI2 kernels, 32 elements per block, every dtype: the codec logic
// works on 32 exponent bytes and masks of the +0.0 and -0.0 lanes (the -0.0
// one only in chunks that code -0.0: the kernels take it as a template flag);
// Lanes<T> does the dtype's fields.
// Compiled for that target whatever the build flags; called only after the
// run-time CPU check.
//
// Escapes (a few % of elements) and omitted zeros are moved with branch-free
// pshufb compaction/expansion, 8 bytes at a time: a branch per block on
// "has an escape" mispredicts on half the blocks and cost more than the rest
// of the block. Those moves use whole 8-byte loads and stores past the last
// byte they need ("sloppy"); callers keep them inside the chunk's own segment
// (writes) or the payload (reads) via the *_end pointers.
// --------------------------------------------------------------------------
//
// The VBMI2 pass (ZC_VBMI2) compiles this section again as namespace avx512,
// with AVX-512 BW/VL/VBMI2 added to the target: the compaction and expansion
// functions then take one vpcompressb/vpexpandb, fp32's 3-byte sm groups move
// around omitted zeros the same way, 16 lanes at a time in 512-bit vectors,
// bf16 / fp16 decode assemble a block's words in one 512-bit vector, and the
// encoder splits them from one (vpmovwb narrows each field to bytes) and
// finds a block's zeros of both signs by 512-bit compares into mask
// registers (zero_masks).
// --------------------------------------------------------------------------
// The VBMI2 build: compilers that know the target (GCC 8, clang 6 on) and
// builds not told otherwise (-DZIPCCL_NO_VBMI2).
#if (defined(__x86_64__) || defined(__i386__)) && !defined(ZIPCCL_NO_VBMI2) && \
    ((defined(__clang__) && __clang_major__ >= 6) ||                         \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 8))
#define ZIPCCL_HAVE_VBMI2_KERNELS 1
#endif
#if (defined(__x86_64__) || defined(__i386__)) && \
    (!defined(ZIPCCL_VBMI2_PASS) || defined(ZIPCCL_HAVE_VBMI2_KERNELS))
// Lanes<FP32>::emit and ::assemble are always inlined: with an instantiation
// of each kernel per zero-code flag, GCC's budget left each a call per block,
// which measured slower (benchmarks/zero_speed.py --baseline).
#define ZC_INLINE __attribute__((always_inline))
#ifndef ZIPCCL_VBMI2_PASS
#define ZIPCCL_HAVE_AVX2_KERNELS 1
#define ZC_AVX2 __attribute__((target("avx2,bmi,bmi2,popcnt")))
#define ZC_VBMI2 0
namespace avx2 {
#else
#define ZC_AVX2 \
  __attribute__((target("avx2,bmi,bmi2,popcnt,avx512f,avx512bw,avx512vl,avx512vbmi2")))
#define ZC_VBMI2 1
namespace avx512 {
#endif

#if !ZC_VBMI2  // the tables of the AVX2 byte moves (VBMI2 has instructions for them)
// For an 8-bit mask: pshufb indices that gather its set lanes to the front
// (compact), and that send the k-th source byte to the k-th set lane (expand).
// 0x80 (zero) elsewhere.
struct ByteLuts {
  uint64_t compact[256], expand[256];
  ByteLuts() {
    for (int m = 0; m < 256; ++m) {
      uint64_t c = 0x8080808080808080ull, e = c;
      for (int j = 0, k = 0; j < 8; ++j) {
        if (!((m >> j) & 1)) continue;
        c = (c & ~(0xFFull << (8 * k))) | (uint64_t(j) << (8 * k));
        e = (e & ~(0xFFull << (8 * j))) | (uint64_t(k) << (8 * j));
        ++k;
      }
      compact[m] = c;
      expand[m] = e;
    }
  }
};
static const ByteLuts kByteLuts;
// fp32's 3-byte sm groups of 4 elements (one 128-bit lane of 32-bit words),
// for a 4-bit keep mask: pshufb indices that pack the low 3 bytes of the kept
// words to the front (compact), and that send the k-th packed group to the
// k-th kept word (expand). 0x80 (zero) elsewhere.
struct Sm3Luts {
  alignas(16) uint8_t compact[16][16], expand[16][16];
  Sm3Luts() {
    for (int m = 0; m < 16; ++m) {
      std::memset(compact[m], 0x80, 16);
      std::memset(expand[m], 0x80, 16);
      for (int j = 0, k = 0; j < 4; ++j) {
        if (!((m >> j) & 1)) continue;
        for (int b = 0; b < 3; ++b) {
          compact[m][3 * k + b] = uint8_t(4 * j + b);
          expand[m][4 * j + b] = uint8_t(3 * k + b);
        }
        ++k;
      }
    }
  }
};
static const Sm3Luts kSm3Luts;
constexpr uint64_t kHiGroup = 0x0808080808080808ull;  // index offset of a qword's upper group
#endif
constexpr uint64_t kEven = 0x5555555555555555ull, kOdd = 0xAAAAAAAAAAAAAAAAull;

ZC_AVX2 static inline uint32_t movemask(__m256i v) { return uint32_t(_mm256_movemask_epi8(v)); }

// Software prefetch this far ahead of a stream (measured better than the
// hardware prefetcher alone on the fixed3 write pass).
constexpr int kPrefetchBytes = 1024;
static inline void prefetch_ahead(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}
// The fixed3 decoder and encoder (bf16, fp16) prefetch the segment of the
// chunk their thread takes next (next, null when another thread may take it),
// spread over the blocks of the current chunk: a chunk's sub-streams are too
// short for the hardware prefetcher to pick up before they end, and a whole
// chunk ahead is far enough to hide the memory's latency. Lines a block: a
// bf16 or fp16 segment has fewer lines than a chunk has blocks, an fp32 one
// fewer than two per block. Always inlined: GCC takes an out-of-line function
// that only prefetches for one without effects and deletes its calls.
template <class T>
ZC_AVX2 __attribute__((always_inline)) static inline void prefetch_next(const uint8_t* next,
                                                                       int64_t next_nbytes, int b) {
  constexpr int kLines = T::kF32 ? 2 : 1;
  if (64 * kLines * int64_t(b) < next_nbytes)
    for (int k = 0; k < kLines; ++k)
      _mm_prefetch(reinterpret_cast<const char*>(next) + 64 * (kLines * b + k), _MM_HINT_T0);
}
ZC_AVX2 static inline int pop(uint32_t m) { return _mm_popcnt_u32(m); }

// Writes the bytes of v whose bit is set in keep, in order, at dst; returns
// the end. Stores reach dst + 32.
ZC_AVX2 static inline uint8_t* compact32(__m256i v, uint32_t keep, uint8_t* dst) {
#if ZC_VBMI2
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_maskz_compress_epi8(keep, v));
  return dst + pop(keep);
#else
  const uint64_t* L = kByteLuts.compact;
  const __m128i a = _mm_shuffle_epi8(
      _mm256_castsi256_si128(v), _mm_set_epi64x(int64_t(L[(keep >> 8) & 0xFF] + kHiGroup),
                                                int64_t(L[keep & 0xFF])));
  const __m128i b = _mm_shuffle_epi8(
      _mm256_extracti128_si256(v, 1),
      _mm_set_epi64x(int64_t(L[keep >> 24] + kHiGroup), int64_t(L[(keep >> 16) & 0xFF])));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), a);
  dst += pop(keep & 0xFF);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_unpackhi_epi64(a, a));
  dst += pop((keep >> 8) & 0xFF);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), b);
  dst += pop((keep >> 16) & 0xFF);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_unpackhi_epi64(b, b));
  return dst + pop(keep >> 24);
#endif
}

// compact32 that writes nothing at or past end.
ZC_AVX2 static inline uint8_t* put_compact(__m256i v, uint32_t keep, uint8_t* dst,
                                           const uint8_t* end) {
  if (__builtin_expect(end - dst >= 32, 1)) return compact32(v, keep, dst);
#if ZC_VBMI2
  // A compress into a register and a byte-masked store of its popcount(keep)
  // bytes: some CPUs (AMD Zen 4) run the compress-store that does both in
  // one instruction as microcode, and this path takes every block of a
  // stream's last 32 bytes.
  const int k = pop(keep);
  _mm256_mask_storeu_epi8(dst, _bzhi_u32(~0u, k), _mm256_maskz_compress_epi8(keep, v));
  return dst + k;
#else
  alignas(32) uint8_t tmp[64];
  const size_t k = size_t(compact32(v, keep, tmp) - tmp);
  std::memcpy(dst, tmp, k);
  return dst + k;
#endif
}

// Lane i of the result: the next source byte if bit i of m is set, else 0.
// Loads reach src + 32.
ZC_AVX2 static inline __m256i expand32(const uint8_t* src, uint32_t m) {
#if ZC_VBMI2
  return _mm256_maskz_expand_epi8(m, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
#else
  // Each half's 16 lanes from one 16-byte load: its second 8 lanes take the
  // bytes after its first 8's (c of them), so their table indices move up by
  // c (0x80, zero, stays at or above 0x80; no byte carries).
  const uint64_t* L = kByteLuts.expand;
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  const uint64_t c0 = pop(m & 0xFF), c1 = pop(m & 0xFFFF), c2 = pop((m >> 16) & 0xFF);
  const __m128i a = _mm_shuffle_epi8(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)),
      _mm_set_epi64x(int64_t(L[(m >> 8) & 0xFF] + c0 * kOnes), int64_t(L[m & 0xFF])));
  const __m128i b = _mm_shuffle_epi8(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c1)),
      _mm_set_epi64x(int64_t(L[m >> 24] + c2 * kOnes), int64_t(L[(m >> 16) & 0xFF])));
  return _mm256_set_m128i(b, a);
#endif
}

// expand32 that reads nothing at or past end.
ZC_AVX2 static inline __m256i get_expand(const uint8_t* src, uint32_t m, const uint8_t* end) {
  if (__builtin_expect(end - src >= 32, 1)) return expand32(src, m);
#if ZC_VBMI2
  return _mm256_maskz_expandloadu_epi8(m, src);  // loads popcount(m) bytes
#else
  alignas(32) uint8_t tmp[32] = {};
  std::memcpy(tmp, src, size_t(std::min<ptrdiff_t>(32, end - src)));
  return expand32(tmp, m);
#endif
}

// Branch-free bit streams: every put stores 8 bytes at the write position
// and every get loads 8 at the read position, so no data-dependent
// flush/refill branch sits in the pdep/popcnt chains of the dense tiers.
// Only the last 8 bytes of a segment (writes) or payload (reads) take the
// exact path.
struct FastBitWriter {
  uint8_t* p;
  const uint8_t* end;  // segment end
  uint64_t buf = 0;    // bits [0, nb) pending, nb < 8 between calls
  int nb = 0;
  FastBitWriter(uint8_t* dst, const uint8_t* seg_end) : p(dst), end(seg_end) {}
  // v < 2**bits, bits <= 56.
  inline void put(uint64_t v, int bits) {
    buf |= v << nb;
    nb += bits;
    if (__builtin_expect(end - p >= 8, 1))
      std::memcpy(p, &buf, 8);
    else
      std::memcpy(p, &buf, size_t(std::max<ptrdiff_t>(0, std::min<ptrdiff_t>(8, end - p))));
    const int bytes = nb >> 3;
    p += bytes;
    buf = bytes ? buf >> (8 * bytes) : buf;  // shifts < 64: nb <= 63
    nb &= 7;
  }
  inline void put64(uint64_t v, int bits) {  // bits <= 64
    if (__builtin_expect(bits > 56, 0)) {
      put(v & 0xFFFFFFFFu, 32);
      put(v >> 32, bits - 32);
    } else {
      put(v, bits);
    }
  }
  // Hands the position over to a BitWriter for the scalar tail.
  inline BitWriter to_scalar() const {
    BitWriter w(p);
    w.buf = buf;
    w.nb = nb;
    return w;
  }
};

struct FastBitReader {
  const uint8_t* base;
  const uint8_t* end;  // payload end: loads past the segment are masked off
  uint64_t pos = 0;    // bit position
  FastBitReader(const uint8_t* src, const uint8_t* payload_end) : base(src), end(payload_end) {}
  inline uint64_t get(int bits) {  // bits <= 56
    const uint8_t* q = base + (pos >> 3);
    uint64_t v = 0;
    if (__builtin_expect(end - q >= 8, 1))
      std::memcpy(&v, q, 8);
    else if (end > q)
      std::memcpy(&v, q, size_t(end - q));
    v >>= pos & 7;
    pos += uint64_t(bits);
    return v & ((uint64_t(1) << bits) - 1);
  }
  inline uint64_t get64(int bits) {  // bits <= 64
    if (__builtin_expect(bits > 56, 0)) {
      const uint64_t lo = get(32);
      return lo | (get(bits - 32) << 32);
    }
    return get(bits);
  }
  // Hands the position over to a BitReader bounded by the segment.
  inline BitReader to_scalar(const uint8_t* seg_end) const {
    const uint8_t* q = base + (pos >> 3);
    BitReader r(q, std::max<ptrdiff_t>(0, seg_end - q));
    if (pos & 7) r.get(int(pos & 7));
    return r;
  }
};

// 32 codes (bytes < 8) -> their 96 bits, 3 bits each, LSB first, in the
// low 12 bytes.
ZC_AVX2 static inline __m128i pack3(__m256i c) {
  const __m256i p = _mm256_maddubs_epi16(c, _mm256_set1_epi16(0x0801));     // c0 + 8 c1
  const __m256i q = _mm256_madd_epi16(p, _mm256_set1_epi32(0x00400001));   // p0 + 64 p1
  const __m256i r = _mm256_or_si256(q, _mm256_srli_epi64(q, 20));           // 24 bits / qword
  const __m256i idx = _mm256_setr_epi8(0, 1, 2, 8, 9, 10, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                       -1, -1, -1, -1, -1, -1, 0, 1, 2, 8, 9, 10, -1, -1, -1, -1);
  const __m256i s = _mm256_shuffle_epi8(r, idx);
  return _mm_or_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

// pack3's 12 bytes at dst.
ZC_AVX2 static inline void store_pack3(uint8_t* dst, __m256i c) {
  const __m128i v = pack3(c);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), v);
  const uint32_t hi = uint32_t(_mm_extract_epi32(v, 2));
  std::memcpy(dst + 8, &hi, 4);
}

// pack3's bits as two 48-bit halves (codes 0-15, 16-31), from the register:
// through memory, the load of the second half would span two stores and
// wait for both (no store forwarding).
ZC_AVX2 static inline void pack3_halves(__m256i c, uint64_t* lo, uint64_t* hi) {
  const __m128i v = pack3(c);
  *lo = uint64_t(_mm_cvtsi128_si64(v)) & 0xFFFFFFFFFFFFull;
  *hi = uint64_t(_mm_cvtsi128_si64(_mm_srli_si128(v, 6))) & 0xFFFFFFFFFFFFull;
}

// 12 bytes of 3-bit codes -> 32 code bytes.
ZC_AVX2 static inline __m256i unpack3(const uint8_t* src) {
  uint32_t tail;
  std::memcpy(&tail, src + 8, 4);
  const __m128i x = _mm_insert_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)),
                                     int(tail), 2);
  const __m256i y = _mm256_broadcastsi128_si256(x);
  // Word j of a lane holds the two bytes that contain code j; mult moves its
  // bits to [7, 10).
  const __m256i idx = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 1, 2, 1, 2, 1, 2, 2, 3, 2, 3,
                                       3, 4, 3, 4, 3, 4, 4, 5, 4, 5, 4, 5, 5, 6, 5, 6);
  const __m256i mult = _mm256_setr_epi16(128, 16, 2, 64, 8, 1, 32, 4, 128, 16, 2, 64, 8, 1, 32, 4);
  const __m256i seven = _mm256_set1_epi16(7);
  const __m256i lo = _mm256_and_si256(
      _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(y, idx), mult), 7), seven);
  const __m256i hi = _mm256_and_si256(
      _mm256_srli_epi16(
          _mm256_mullo_epi16(_mm256_shuffle_epi8(y, _mm256_add_epi8(idx, _mm256_set1_epi8(6))),
                             mult),
          7),
      seven);
  return _mm256_permute4x64_epi64(_mm256_packus_epi16(lo, hi), 0xD8);
}

// 32 digits (bytes < 4) -> 8 bytes, 2 bits each, LSB first.
ZC_AVX2 static inline uint64_t pack2(__m256i d) {
  const __m256i p = _mm256_maddubs_epi16(d, _mm256_set1_epi16(0x0401));     // d0 + 4 d1
  const __m256i q = _mm256_madd_epi16(p, _mm256_set1_epi32(0x00100001));   // p0 + 16 p1
  const __m256i idx = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                       -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i s = _mm256_shuffle_epi8(q, idx);
  return uint64_t(_mm_cvtsi128_si64(
      _mm_or_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1))));
}

// Byte i = 0xFF where bit i of m is set.
ZC_AVX2 static inline __m256i mask_bytes(uint32_t m) {
#if ZC_VBMI2
  return _mm256_movm_epi8(m);
#else
  const __m256i rep = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(m)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                       3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit);
#endif
}

// Dense ranks of 32 exponent bytes: rank LUT on e - base + 8 in [0, 16),
// ESC outside; the rank of +0.0 on the pos lanes and of -0.0 on the neg lanes
// where the chunk's symbol table has one (kLuts.zrank).
struct DenseRanker {
  __m256i lutx, lo, hi, bias, rpos, rneg, esc;
  bool has_pos, has_neg;
  ZC_AVX2 DenseRanker(int base, int phase, bool zp, bool zn) {
    alignas(32) uint8_t t[32];
    for (int d = 0; d < 16; ++d) t[d] = t[d + 16] = kLuts.rank[zp][zn][phase][d] ^ kDenseEsc;
    lutx = _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
    // e - base + 8 in [0, 16) as integers <=> e in [max(base-8, 0), min(base+7, 255)]
    // (bytes wrap, so the range test comes first).
    lo = _mm256_set1_epi8(char(std::max(base - 8, 0)));
    hi = _mm256_set1_epi8(char(std::min(base + 7, 255)));
    bias = _mm256_set1_epi8(char(base - 8));
    const int8_t* zr = kLuts.zrank[zp][zn][phase];
    has_pos = zr[0] >= 0;
    has_neg = zr[1] >= 0;
    rpos = _mm256_set1_epi8(char(zr[0]));
    rneg = _mm256_set1_epi8(char(zr[1]));
    esc = _mm256_set1_epi8(kDenseEsc);
  }
  // The lanes that code as a zero symbol (no sm byte), of the pos / neg masks.
  ZC_AVX2 inline __m256i coded(__m256i pos, __m256i neg) const {
    const __m256i z = _mm256_setzero_si256();
    return _mm256_or_si256(has_pos ? pos : z, has_neg ? neg : z);
  }
  ZC_AVX2 inline __m256i operator()(__m256i e8, __m256i pos, __m256i neg) const {
    const __m256i in = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_max_epu8(e8, lo), e8),
                                        _mm256_cmpeq_epi8(_mm256_min_epu8(e8, hi), e8));
    const __m256i d = _mm256_sub_epi8(e8, bias);
    const __m256i idx = _mm256_or_si256(d, _mm256_xor_si256(in, _mm256_set1_epi8(-1)));
    __m256i r = _mm256_xor_si256(_mm256_shuffle_epi8(lutx, idx), esc);
    if (has_pos) r = _mm256_blendv_epi8(r, rpos, pos);
    if (has_neg) r = _mm256_blendv_epi8(r, rneg, neg);
    return r;
  }
};

// Dense chunks take the escape move in every block when their escapes are
// this common (n_esc * kEscEveryBlock >= blocks), else only in blocks that
// have one: escapes are rare in dense (few Gaussian blocks have one), where a
// branch beats the move; where zeros that take no code escape (x * mask below
// the zero-code threshold), most blocks have one and the branch mispredicts.
// The move is one instruction with VBMI2, about 20 without.
constexpr int kEscEveryBlock = ZC_VBMI2 ? 8 : 2;

// ~0u where a dense chunk takes the escape move in every block, else 0. The
// kernels test `mask | escm`, one integer test: as `every || escm` the
// compiler tests escm first, a branch that mispredicts in about half the
// blocks exactly where every block takes the move.
static inline uint32_t esc_every_block_mask(const Entry& en, int n) {
  return int64_t(en.n_esc) * kEscEveryBlock >= n / 32 ? ~0u : 0u;
}

ZC_AVX2 static inline uint32_t gt(__m256i r, int k) {  // mask of ranks > k
  return movemask(_mm256_cmpgt_epi8(r, _mm256_set1_epi8(char(k))));
}

// ---- element fields, per dtype ----
// Lanes<T> turns 32 words into exponent bytes and a +0.0 mask (0xFF bytes;
// neg_zero_lanes gives the -0.0 one), emits the sm (and fp16 rem) of the kept
// ones on encode, and assembles the words from exponent bytes on decode, the
// zero lanes from the zero and -0.0 masks. The codec logic above it is shared.
struct EncSt {
  uint8_t* sm;
  const uint8_t* sm_end;
  FastBitWriter rem;
  bool omits;  // the chunk codes zeros without sm (n_zero > 0), so keep may drop lanes
};

// Whether a block takes the straight store of all its sm bytes: every lane
// kept. With VBMI2 a chunk that omits zeros compresses every block instead
// (a compress of every lane is that store): in a chunk with a few zeros, a
// test of keep is a branch that mispredicts.
// One compare (omits clears a bit keep must have): as `!omits && keep == ~0u`
// the compiler may test keep first, a branch that mispredicts in chunks whose
// blocks hold a zero about half the time (5% x * mask).
ZC_AVX2 static inline bool store_all(uint32_t keep, const EncSt& st) {
  return (keep & ~uint32_t(ZC_VBMI2 && st.omits)) == ~0u;
}

// store_all's twin: whether a block's sm bytes are one straight load.
// (Here the two tests measured faster than store_all's one compare:
// benchmarks/zero_speed.py.)
ZC_AVX2 static inline bool load_all(uint32_t keep, const DecIn& in) {
  return !(ZC_VBMI2 && in.omits) && keep == ~0u;
}

// Next 32 sm bytes for the lanes in keep (zeros elsewhere); false if the
// segment holds fewer than popcount(keep).
ZC_AVX2 static inline bool take_sm(DecIn& in, uint32_t keep, __m256i* s8) {
  const int k = pop(keep);
  if (in.sm_end - in.sm < k) return false;
  *s8 = load_all(keep, in) ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.sm))
                    : get_expand(in.sm, keep, in.sm_lim);
  in.sm += k;
  return true;
}

ZC_AVX2 static inline void put_sm_bytes(__m256i v, uint32_t keep, EncSt& st) {
  if (store_all(keep, st) && st.sm_end - st.sm >= 32) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(st.sm), v);
    st.sm += 32;
  } else {
    st.sm = put_compact(v, keep, st.sm, st.sm_end);
  }
}

// Bytes of two vectors of 16-bit lanes (< 256), in element order.
ZC_AVX2 static inline __m256i pack16(__m256i a, __m256i b) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
}

// Words of 16 elements (one half of a block) as 16-bit lanes.
ZC_AVX2 static inline __m256i half16(__m256i v8, int h) {
  return _mm256_cvtepu8_epi16(h ? _mm256_extracti128_si256(v8, 1) : _mm256_castsi256_si128(v8));
}
ZC_AVX2 static inline __m256i half16_mask(__m256i m8, int h) {
  return _mm256_cvtepi8_epi16(h ? _mm256_extracti128_si256(m8, 1) : _mm256_castsi256_si128(m8));
}
// Quarter q (8 elements) as 32-bit lanes.
ZC_AVX2 static inline __m128i quarter8(__m256i v8, int q) {
  const __m128i h = q >= 2 ? _mm256_extracti128_si256(v8, 1) : _mm256_castsi256_si128(v8);
  return (q & 1) ? _mm_srli_si128(h, 8) : h;
}

// 3-bit fields of 16 elements: the mask with 0b111 on every lane of keep16.
ZC_AVX2 static inline uint64_t mask3(uint32_t keep16) { return _pdep_u64(keep16, 0x249249249249ull) * 7; }

// Words of half h of a block (16-bit lanes) with the zero lanes replaced:
// +0.0 on zero lanes, -0.0 where neg is set too.
ZC_AVX2 static inline __m256i with_zeros16(__m256i w, __m256i zero, __m256i neg, int h) {
  return _mm256_or_si256(_mm256_andnot_si256(half16_mask(zero, h), w),
                         _mm256_and_si256(half16_mask(neg, h), _mm256_set1_epi16(int16_t(0x8000))));
}

// 0xFF bytes on the lanes of two vectors of 16-bit words (a: lanes 0-15)
// equal to s.
ZC_AVX2 static inline __m256i eq_lanes16(__m256i a, __m256i b, __m256i s) {
#if ZC_VBMI2
  return _mm256_movm_epi8(uint32_t(_mm256_cmpeq_epi16_mask(a, s)) |
                          uint32_t(_mm256_cmpeq_epi16_mask(b, s)) << 16);
#else
  return _mm256_permute4x64_epi64(
      _mm256_packs_epi16(_mm256_cmpeq_epi16(a, s), _mm256_cmpeq_epi16(b, s)), 0xD8);
#endif
}

template <class T>
struct Lanes;

template <>
struct Lanes<BF16> {
  struct Raw {
    __m256i sm8;
  };
  ZC_AVX2 static inline void fields(const uint16_t* w, __m256i* e8, __m256i* zero, Raw* raw) {
#if ZC_VBMI2
    // The block as one 512-bit vector, each field narrowed to bytes by
    // truncation (vpmovwb: the exponent is the low byte of w >> 7).
    const __m512i v = _mm512_loadu_si512(w);
    *e8 = _mm512_cvtepi16_epi8(_mm512_srli_epi16(v, 7));
    *zero = _mm256_movm_epi8(_cvtmask32_u32(_mm512_testn_epi16_mask(v, v)));
    if (raw)  // sm = sign << 7 | mantissa: ((w >> 8) & 0x80) | (w & 0x7F)
      raw->sm8 = _mm512_cvtepi16_epi8(_mm512_ternarylogic_epi32(
          _mm512_srli_epi16(v, 8), _mm512_set1_epi16(0x80),
          _mm512_and_si512(v, _mm512_set1_epi16(0x7F)), 0xEA));
#else
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    const __m256i ff = _mm256_set1_epi16(0xFF);
    *e8 = pack16(_mm256_and_si256(_mm256_srli_epi16(a, 7), ff),
                 _mm256_and_si256(_mm256_srli_epi16(b, 7), ff));
    *zero = eq_lanes16(a, b, _mm256_setzero_si256());
    if (raw) {  // sm = sign << 7 | mantissa
      const __m256i s80 = _mm256_set1_epi16(0x80), s7f = _mm256_set1_epi16(0x7F);
      raw->sm8 = pack16(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 8), s80),
                                        _mm256_and_si256(a, s7f)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 8), s80),
                                        _mm256_and_si256(b, s7f)));
    }
#endif
  }
  ZC_AVX2 static inline void emit(const Raw& r, const uint16_t*, uint32_t keep, bool, EncSt& st) {
    put_sm_bytes(r.sm8, keep, st);
  }
  // A zero lane's word is its sm byte (0, or 0x80 on -0.0 lanes) with exponent 0.
  ZC_AVX2 static inline int assemble(__m256i e8, __m256i zero, __m256i neg, uint32_t keep, bool,
                                     DecIn& in, FastBitReader&, uint16_t* out) {
#if ZC_VBMI2
    // The 32 words in one 512-bit vector of 16-bit lanes: one widening of
    // the sm and the exponent bytes each, where 256-bit vectors take two.
    __m256i s8;
    if (!take_sm(in, keep, &s8)) return kErrCounts;
    s8 = _mm256_or_si256(s8, _mm256_and_si256(neg, _mm256_set1_epi8(char(0x80))));
    const __m512i s = _mm512_cvtepu8_epi16(s8);
    const __m512i e = _mm512_cvtepu8_epi16(_mm256_andnot_si256(zero, e8));
    const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(s, _mm512_set1_epi16(0x80)), 8);
    // (s & 0x7F) | sign | e << 7
    const __m512i w = _mm512_ternarylogic_epi32(s, _mm512_set1_epi16(0x7F), sign, 0xEA);
    _mm512_storeu_si512(out, _mm512_or_si512(w, _mm512_slli_epi16(e, 7)));
    return kOk;
#else
    __m256i s8;
    if (!take_sm(in, keep, &s8)) return kErrCounts;
    e8 = _mm256_andnot_si256(zero, e8);
    s8 = _mm256_or_si256(s8, _mm256_and_si256(neg, _mm256_set1_epi8(char(0x80))));
    const __m256i m80 = _mm256_set1_epi16(0x80), m7f = _mm256_set1_epi16(0x7F);
    for (int h = 0; h < 2; ++h) {
      const __m256i e = half16(e8, h), s = half16(s8, h);
      const __m256i w = _mm256_or_si256(
          _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(s, m80), 8), _mm256_slli_epi16(e, 7)),
          _mm256_and_si256(s, m7f));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * h), w);
    }
    return kOk;
#endif
  }
};

template <>
struct Lanes<FP16> {
  struct Raw {
    __m256i sm8, rem8;  // low 8 bits of sm; sign << 2 | top 2 mantissa bits
  };
  ZC_AVX2 static inline void fields(const uint16_t* w, __m256i* e8, __m256i* zero, Raw* raw) {
#if ZC_VBMI2
    // As Lanes<BF16>::fields: one 512-bit vector, fields narrowed by vpmovwb
    // (sm is the word's low byte).
    const __m512i v = _mm512_loadu_si512(w);
    *e8 = _mm512_cvtepi16_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 10), _mm512_set1_epi16(0x1F)));
    *zero = _mm256_movm_epi8(_cvtmask32_u32(_mm512_testn_epi16_mask(v, v)));
    if (raw) {
      raw->sm8 = _mm512_cvtepi16_epi8(v);
      raw->rem8 = _mm512_cvtepi16_epi8(_mm512_ternarylogic_epi32(  // (w >> 13) & 4 | (w >> 8) & 3
          _mm512_srli_epi16(v, 13), _mm512_set1_epi16(4),
          _mm512_and_si512(_mm512_srli_epi16(v, 8), _mm512_set1_epi16(3)), 0xEA));
    }
#else
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    const __m256i m1f = _mm256_set1_epi16(0x1F), ff = _mm256_set1_epi16(0xFF);
    *e8 = pack16(_mm256_and_si256(_mm256_srli_epi16(a, 10), m1f),
                 _mm256_and_si256(_mm256_srli_epi16(b, 10), m1f));
    *zero = eq_lanes16(a, b, _mm256_setzero_si256());
    if (raw) {
      raw->sm8 = pack16(_mm256_and_si256(a, ff), _mm256_and_si256(b, ff));
      const __m256i m4 = _mm256_set1_epi16(4), m3 = _mm256_set1_epi16(3);
      raw->rem8 = pack16(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 13), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(a, 8), m3)),
                         _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 13), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(b, 8), m3)));
    }
#endif
  }
  ZC_AVX2 static inline void emit(const Raw& r, const uint16_t*, uint32_t keep, bool, EncSt& st) {
    put_sm_bytes(r.sm8, keep, st);
    uint64_t lo, hi;
    pack3_halves(r.rem8, &lo, &hi);
    if (store_all(keep, st)) {
      st.rem.put(lo, 48);
      st.rem.put(hi, 48);
    } else {  // drop the 3-bit fields of omitted zeros
      const uint32_t k0 = keep & 0xFFFF, k1 = keep >> 16;
      st.rem.put(_pext_u64(lo, mask3(k0)), 3 * pop(k0));
      st.rem.put(_pext_u64(hi, mask3(k1)), 3 * pop(k1));
    }
  }
  ZC_AVX2 static inline int assemble(__m256i e8, __m256i zero, __m256i neg, uint32_t keep, bool,
                                     DecIn& in, FastBitReader& rr, uint16_t* out) {
    __m256i s8;
    if (!take_sm(in, keep, &s8)) return kErrCounts;  // also bounds the rem reads
    const uint32_t k0 = keep & 0xFFFF, k1 = keep >> 16;
    uint64_t lo = rr.get(3 * pop(k0)), hi = rr.get(3 * pop(k1));
    // A test of keep itself would mispredict in chunks whose blocks hold a
    // zero about half the time (5% x * mask): pdep leaves a full keep's
    // fields where they are.
    if (in.omits) {
      lo = _pdep_u64(lo, mask3(k0));
      hi = _pdep_u64(hi, mask3(k1));
    }
    alignas(16) uint8_t buf[16];
    std::memcpy(buf, &lo, 8);
    std::memcpy(buf + 6, &hi, 8);
    __m256i r8 = unpack3(buf);
#if ZC_VBMI2
    // One 512-bit vector of 16-bit lanes, as Lanes<BF16>::assemble. A zero
    // lane is never kept: its sm byte and rem bits are 0 (expand and pdep
    // fill omitted lanes with zeros), so with its exponent set to 0 its word
    // is +0.0, or -0.0 with the rem's sign bit set.
    r8 = _mm256_or_si256(r8, _mm256_and_si256(neg, _mm256_set1_epi8(4)));
    const __m512i e = _mm512_cvtepu8_epi16(_mm256_andnot_si256(zero, e8));
    const __m512i s = _mm512_cvtepu8_epi16(s8), r = _mm512_cvtepu8_epi16(r8);
    const __m512i top = _mm512_or_si512(  // sign to bit 15, mantissa bits 9, 8
        _mm512_slli_epi16(_mm512_and_si512(r, _mm512_set1_epi16(4)), 13),
        _mm512_slli_epi16(_mm512_and_si512(r, _mm512_set1_epi16(3)), 8));
    _mm512_storeu_si512(out, _mm512_ternarylogic_epi32(top, _mm512_slli_epi16(e, 10), s, 0xFE));
    return kOk;
#else
    const __m256i m4 = _mm256_set1_epi16(4), m3 = _mm256_set1_epi16(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i e = half16(e8, h), s = half16(s8, h), r = half16(r8, h);
      const __m256i w = _mm256_or_si256(
          _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(r, m4), 13), _mm256_slli_epi16(e, 10)),
          _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(r, m3), 8), s));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * h),
                          with_zeros16(w, zero, neg, h));
    }
    return kOk;
#endif
  }
};

template <>
struct Lanes<FP32> {
  struct Raw {
    __m256i v[4];
  };
  // Bytes of four vectors of 32-bit lanes (< 256), in element order.
  ZC_AVX2 static inline __m256i pack32(const __m256i* x, bool sat_signed) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i p = sat_signed ? _mm256_packs_epi16(_mm256_packs_epi32(x[0], x[1]),
                                                      _mm256_packs_epi32(x[2], x[3]))
                                 : _mm256_packus_epi16(_mm256_packus_epi32(x[0], x[1]),
                                                       _mm256_packus_epi32(x[2], x[3]));
    return _mm256_permutevar8x32_epi32(p, order);
  }
  ZC_AVX2 static inline void fields(const uint32_t* w, __m256i* e8, __m256i* zero, Raw* raw) {
    __m256i v[4], e[4];
    const __m256i ff = _mm256_set1_epi32(0xFF), zz = _mm256_setzero_si256();
#if ZC_VBMI2
    uint32_t zm = 0;
#else
    __m256i z[4];
#endif
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 8 * k));
      e[k] = _mm256_and_si256(_mm256_srli_epi32(v[k], 23), ff);
#if ZC_VBMI2
      zm |= uint32_t(_mm256_cmpeq_epi32_mask(v[k], zz)) << (8 * k);
#else
      z[k] = _mm256_cmpeq_epi32(v[k], zz);
#endif
      if (raw) raw->v[k] = v[k];
    }
    *e8 = pack32(e, false);
#if ZC_VBMI2
    *zero = _mm256_movm_epi8(zm);
#else
    *zero = pack32(z, true);
#endif
  }
  // Bytes past the last sm byte that get_groups' loads may touch.
  static constexpr int kGetSlack = ZC_VBMI2 ? 64 : 16;
#if ZC_VBMI2
  // The 3-byte sm groups (sign << 23 | mantissa) of the 16 words at w whose
  // bit is set in keep16, in order, at dst; returns the end. One compress
  // and a byte-masked store of exactly its 3 * popcount bytes (nothing past
  // them: no slack, every block to the stream's end takes it).
  ZC_AVX2 static inline uint8_t* put_groups16(const uint32_t* w, uint32_t keep16, uint8_t* dst) {
    const __m512i v = _mm512_loadu_si512(w);
    const __m512i sm = _mm512_ternarylogic_epi32(  // (v & man) | sign
        v, _mm512_set1_epi32(0x7FFFFF),
        _mm512_and_si512(_mm512_srli_epi32(v, 8), _mm512_set1_epi32(0x800000)), 0xEA);
    const int nbytes = 3 * pop(keep16);
    _mm512_mask_storeu_epi8(
        dst, _bzhi_u64(~0ull, unsigned(nbytes)),
        _mm512_maskz_compress_epi8(_pdep_u64(keep16, 0x1111111111111111ull) * 7, sm));
    return dst + nbytes;
  }
#else
  // sm of 8 words, in the low 3 bytes of each 32-bit lane: sign << 23 | mantissa.
  ZC_AVX2 static inline __m256i sm24(__m256i v) {
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0x7FFFFF)),
                           _mm256_and_si256(_mm256_srli_epi32(v, 8), _mm256_set1_epi32(0x800000)));
  }
  // Bytes past the last sm byte that put_groups' stores may touch.
  static constexpr int kGroupSlack = 16;
  // The 3-byte sm groups of the words of 8 lanes whose bit is set in keep8, in
  // order, at dst; returns the end. Stores reach dst + 3 * popcount + slack.
  ZC_AVX2 static inline uint8_t* put_groups(__m256i sm, uint32_t keep8, uint8_t* dst) {
    const uint32_t k0 = keep8 & 0xF, k1 = keep8 >> 4;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                     _mm_shuffle_epi8(_mm256_castsi256_si128(sm),
                                      _mm_load_si128(reinterpret_cast<const __m128i*>(
                                          kSm3Luts.compact[k0]))));
    dst += 3 * pop(k0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                     _mm_shuffle_epi8(_mm256_extracti128_si256(sm, 1),
                                      _mm_load_si128(reinterpret_cast<const __m128i*>(
                                          kSm3Luts.compact[k1]))));
    return dst + 3 * pop(k1);
  }
#endif
#if ZC_VBMI2
  // put_groups16's inverse: the next 3-byte groups at *src on the lanes of
  // keep16 (zeros elsewhere), one 512-bit expand; *src moves past them.
  // Loads reach the end + kGetSlack.
  ZC_AVX2 static inline __m512i get_groups16(const uint8_t** src, uint32_t keep16) {
    const __m512i v = _mm512_maskz_expand_epi8(_pdep_u64(keep16, 0x1111111111111111ull) * 7,
                                               _mm512_loadu_si512(*src));
    *src += 3 * pop(keep16);
    return v;
  }
#else
  // put_groups' inverse: the next 3-byte groups at src on the lanes of keep8
  // (zeros elsewhere); *src moves past them. Loads reach the end + kGetSlack.
  ZC_AVX2 static inline __m256i get_groups(const uint8_t** src, uint32_t keep8) {
    const uint32_t k0 = keep8 & 0xF, k1 = keep8 >> 4;
    const __m128i a = _mm_shuffle_epi8(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(*src)),
        _mm_load_si128(reinterpret_cast<const __m128i*>(kSm3Luts.expand[k0])));
    *src += 3 * pop(k0);
    const __m128i b = _mm_shuffle_epi8(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(*src)),
        _mm_load_si128(reinterpret_cast<const __m128i*>(kSm3Luts.expand[k1])));
    *src += 3 * pop(k1);
    return _mm256_set_m128i(b, a);
  }
#endif
  // The low bytes of the 32 words, in no particular order (callers count
  // the zero ones): byte 0 of each 32-bit lane of v[k] moved to byte k of
  // the lane by shifts and blends.
  ZC_AVX2 static inline __m256i low8_bytes(const Raw& r) {
    const __m256i a = _mm256_blend_epi16(r.v[0], _mm256_slli_epi32(r.v[2], 16), 0xAA);
    const __m256i b = _mm256_blend_epi16(_mm256_slli_epi32(r.v[1], 8),
                                         _mm256_slli_epi32(r.v[3], 24), 0xAA);
    return _mm256_blendv_epi8(a, b, _mm256_set1_epi32(int(0xFF00FF00u)));
  }
  ZC_AVX2 static inline __m256i low16_bits(const Raw& r) {
    const __m256i m = _mm256_set1_epi32(0xFFFF);
    return _mm256_and_si256(_mm256_or_si256(_mm256_or_si256(r.v[0], r.v[1]),
                                            _mm256_or_si256(r.v[2], r.v[3])), m);
  }
  ZC_AVX2 ZC_INLINE static inline void emit(const Raw& r, const uint32_t* w, uint32_t keep,
                                            bool low16, EncSt& st) {
    if (low16) {  // one byte: sign << 7 | top 7 mantissa bits
      __m256i s[4];
      const __m256i m80 = _mm256_set1_epi32(0x80), m7f = _mm256_set1_epi32(0x7F);
      for (int k = 0; k < 4; ++k)
        s[k] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(r.v[k], 24), m80),
                               _mm256_and_si256(_mm256_srli_epi32(r.v[k], 16), m7f));
      put_sm_bytes(pack32(s, false), keep, st);
    } else if (store_all(keep, st) && st.sm_end - st.sm >= 104) {  // 3 bytes, 24 per 8 elements
      const __m256i drop = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                            0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
      const __m256i join = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7);
      const __m256i man = _mm256_set1_epi32(0x7FFFFF), sgn = _mm256_set1_epi32(0x800000);
      for (int k = 0; k < 4; ++k) {
        const __m256i sm = _mm256_or_si256(_mm256_and_si256(r.v[k], man),
                                           _mm256_and_si256(_mm256_srli_epi32(r.v[k], 8), sgn));
        _mm256_storeu_si256(
            reinterpret_cast<__m256i*>(st.sm + 24 * k),
            _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(sm, drop), join));
      }
      st.sm += 96;
#if ZC_VBMI2
    } else if (st.sm_end - st.sm >= 3 * pop(keep)) {  // omitted zeros, 16 lanes a step
      st.sm = put_groups16(w, keep & 0xFFFF, st.sm);
      st.sm = put_groups16(w + 16, keep >> 16, st.sm);
#else
    } else if (st.sm_end - st.sm >= 3 * pop(keep) + kGroupSlack) {  // omitted zeros
      for (int k = 0; k < 4; ++k)
        st.sm = put_groups(sm24(r.v[k]), (keep >> (8 * k)) & 0xFF, st.sm);
#endif
    } else {  // the segment's end: element by element
      EncOut o{st.sm, BitWriter(), nullptr};
      for (int i = 0; i < 32; ++i)
        if ((keep >> i) & 1) emit_sm<FP32>(w[i], false, o);
      st.sm = o.sm;
    }
  }
  // fp32 words of quarter q from its sign+mantissa groups s (3 bytes each,
  // widened to a lane: sign at bit 23) and the exponents e8.
  ZC_AVX2 static inline __m256i fp32_words(__m256i s, __m256i e8, int q) {
    const __m256i man = _mm256_set1_epi32(0x7FFFFF), sgn = _mm256_set1_epi32(0x800000);
    return _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(s, man), _mm256_slli_epi32(_mm256_and_si256(s, sgn), 8)),
        _mm256_slli_epi32(_mm256_cvtepu8_epi32(quarter8(e8, q)), 23));
  }
  ZC_AVX2 ZC_INLINE static inline int assemble(__m256i e8, __m256i zero, __m256i neg, uint32_t keep,
                                     bool low16, DecIn& in, FastBitReader&, uint32_t* out) {
    if (low16) {
      __m256i s8;
      if (!take_sm(in, keep, &s8)) return kErrCounts;
      // A zero lane's sm byte is 0 (take_sm) and its exponent is set to 0:
      // its word is +0.0, or -0.0 once its byte gets the sign bit.
      const __m256i ez = _mm256_andnot_si256(zero, e8);
      s8 = _mm256_or_si256(s8, _mm256_and_si256(neg, _mm256_set1_epi8(char(0x80))));
      const __m256i m80 = _mm256_set1_epi32(0x80), m7f = _mm256_set1_epi32(0x7F);
      for (int q = 0; q < 4; ++q) {
        const __m256i e = _mm256_cvtepu8_epi32(quarter8(ez, q)),
                      s = _mm256_cvtepu8_epi32(quarter8(s8, q));
        const __m256i w = _mm256_or_si256(
            _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(s, m80), 24),
                            _mm256_slli_epi32(e, 23)),
            _mm256_slli_epi32(_mm256_and_si256(s, m7f), 16));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * q), w);
      }
      return kOk;
    }
    if (load_all(keep, in) && in.sm_end - in.sm >= 96 && in.sm_lim - in.sm >= 104) {
      const __m256i split = _mm256_setr_epi32(0, 1, 2, 2, 3, 4, 5, 5);
      const __m256i widen = _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,
                                             0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
      for (int q = 0; q < 4; ++q) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in.sm + 24 * q));
        const __m256i s = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(raw, split), widen);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * q), fp32_words(s, e8, q));
      }
      in.sm += 96;
      return kOk;
    }
    const int64_t need = 3 * int64_t(pop(keep));
    if (in.sm_end - in.sm < need) return kErrCounts;
    if (in.sm_lim - in.sm >= need + kGetSlack) {  // omitted zeros
      // An omitted lane's group expands to 0 and its exponent is set to 0,
      // so its word is +0.0 with no fix-up; a -0.0 lane's group gets the
      // sign bit (bit 23 of the group) first. The read position is a local:
      // the vector stores may alias in.sm, which would then be reloaded
      // after each one, a store-forwarding round trip between groups.
      const __m256i ez = _mm256_andnot_si256(zero, e8);
      const uint8_t* src = in.sm;
#if ZC_VBMI2
      // 16 lanes a step in 512-bit vectors: one expand and one word
      // assembly for what takes two of each a quarter at a time.
      const uint32_t negm = movemask(neg);
      const __m512i man = _mm512_set1_epi32(0x7FFFFF), sgn = _mm512_set1_epi32(0x800000);
      for (int h = 0; h < 2; ++h) {
        __m512i s = get_groups16(&src, (keep >> (16 * h)) & 0xFFFF);
        s = _mm512_mask_or_epi32(s, __mmask16(negm >> (16 * h)), s, sgn);
        const __m512i e = _mm512_cvtepu8_epi32(h ? _mm256_extracti128_si256(ez, 1)
                                                 : _mm256_castsi256_si128(ez));
        const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(s, sgn), 8);
        const __m512i w = _mm512_ternarylogic_epi32(s, man, sign, 0xEA);  // (s & man) | sign
        _mm512_storeu_si512(out + 16 * h, _mm512_or_si512(w, _mm512_slli_epi32(e, 23)));
      }
#else
      const __m256i sgn = _mm256_set1_epi32(0x800000);
      for (int q = 0; q < 4; ++q) {
        __m256i s = get_groups(&src, (keep >> (8 * q)) & 0xFF);
        s = _mm256_or_si256(s, _mm256_and_si256(_mm256_cvtepi8_epi32(quarter8(neg, q)), sgn));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8 * q), fp32_words(s, ez, q));
      }
#endif
      in.sm = src;
      return kOk;
    }
    alignas(32) uint8_t e[32];  // the payload's end: element by element
    _mm256_store_si256(reinterpret_cast<__m256i*>(e), e8);
    const uint32_t negm = movemask(neg);
    for (int i = 0; i < 32; ++i) {
      if (!((keep >> i) & 1)) {
        out[i] = ((negm >> i) & 1) ? FP32::kSign : 0u;
      } else if (int err = emit_word<FP32>(in, e[i], false, out + i)) {
        return err;
      }
    }
    return kOk;
  }
};

#if ZC_VBMI2
// The lanes of 32 words that are +0.0 (the mask's low 32 bits) and -0.0
// (high 32), from 512-bit compares straight into mask registers: a zero
// test by 256-bit vectors gives 0xFF bytes that the encoder moves back to a
// mask, and its two 16-lane halves are joined in general registers.
template <class T, bool NEG>
ZC_AVX2 static inline uint64_t zero_masks(const typename T::W* w) {
  if constexpr (T::kF32) {
    const __m512i a = _mm512_loadu_si512(w), b = _mm512_loadu_si512(w + 16);
    const __m512i s = _mm512_set1_epi32(int(T::kSign));
    uint64_t m = _cvtmask32_u32(_mm512_kunpackw(_mm512_testn_epi32_mask(b, b),
                                                _mm512_testn_epi32_mask(a, a)));
    if constexpr (NEG)
      m |= uint64_t(_cvtmask32_u32(_mm512_kunpackw(_mm512_cmpeq_epi32_mask(b, s),
                                                   _mm512_cmpeq_epi32_mask(a, s)))) << 32;
    return m;
  } else {
    const __m512i v = _mm512_loadu_si512(w), s = _mm512_set1_epi16(int16_t(T::kSign));
    uint64_t m = _cvtmask32_u32(_mm512_testn_epi16_mask(v, v));
    if constexpr (NEG) m |= uint64_t(_cvtmask32_u32(_mm512_cmpeq_epi16_mask(v, s))) << 32;
    return m;
  }
}
#endif

// 0xFF bytes on the lanes of 32 words that are -0.0 (only the sign bit set).
template <class T>
ZC_AVX2 static inline __m256i neg_zero_lanes(const typename T::W* w) {
#if ZC_VBMI2
  return _mm256_movm_epi8(uint32_t(zero_masks<T, true>(w) >> 32));
#else
  if constexpr (T::kF32) {
    const __m256i s = _mm256_set1_epi32(int(T::kSign));
    __m256i z[4];
    for (int k = 0; k < 4; ++k)
      z[k] = _mm256_cmpeq_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 8 * k)), s);
    return Lanes<FP32>::pack32(z, true);
  } else {
    const __m256i s = _mm256_set1_epi16(int16_t(T::kSign));
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    return eq_lanes16(a, b, s);
  }
#endif
}

// Escaped lanes whose exponent byte exceeds the dtype's (fp16: > 31).
template <class T>
ZC_AVX2 static inline uint32_t esc_out_of_range(__m256i ex, uint32_t escm) {
  if (T::kEmax >= 255) return 0;
  const __m256i emax = _mm256_set1_epi8(char(T::kEmax));
  return escm & ~movemask(_mm256_cmpeq_epi8(_mm256_max_epu8(ex, emax), emax));
}

// Exponents of the escaped lanes m from the esc stream, zeros elsewhere.
template <class T>
ZC_AVX2 static inline int take_esc(DecIn& in, uint32_t m, __m256i* e8) {
  const int k = pop(m);
  if (in.esc_end - in.esc < k) return kErrCounts;
  *e8 = get_expand(in.esc, m, in.end);
  in.esc += k;
  return esc_out_of_range<T>(*e8, m) ? kErrExponent : kOk;
}

// ---- encode pass 1 ----
template <class T>
ZC_AVX2 static Entry analyze(const typename T::W* w, int n, int codec, int* n_low) {
  using L = Lanes<T>;
  alignas(32) uint8_t ebuf[kChunkElems];
  alignas(32) uint8_t zbuf[kChunkElems];
  const int nb = n / 32;
  __m256i sacc = _mm256_setzero_si256(), lowacc = _mm256_setzero_si256();
  // fp32: per byte lane, the words whose low byte is 0 (at most
  // kChunkElems / 32 = 128 a lane), summed after the loop.
  __m256i low0acc = _mm256_setzero_si256();
  uint64_t K = 0, nz = 0, e0 = 0, low8 = 0;
  // AVX2: exponent-0 lanes (zeros of both signs, subnormals), counted per
  // byte lane (at most kChunkElems / 32 = 128 a lane): a bound on the -0.0
  // count that costs one subtract per block.
  __m256i e0acc = _mm256_setzero_si256();
  const __m256i z = _mm256_setzero_si256(), emax = _mm256_set1_epi8(char(T::kEmax));
  // The -0.0 lanes of each block, kept for the code counts below (zn implies
  // they were counted). AVX-512 counts them here, compares into mask
  // registers: less than a second look at a chunk that has them, and no
  // slower on one that has none.
  uint32_t nbuf[kChunkElems / 32];
  uint64_t nneg = 0;
  for (int b = 0; b < nb; ++b) {
    __m256i e8, zero;
    typename L::Raw raw;
    prefetch_ahead(w + 32 * b);
    L::fields(w + 32 * b, &e8, &zero, T::kF32 ? &raw : nullptr);

    if constexpr (T::kF32) {
      lowacc = _mm256_or_si256(lowacc, L::low16_bits(raw));
      low0acc = _mm256_sub_epi8(low0acc, _mm256_cmpeq_epi8(L::low8_bytes(raw), z));
    }
    const __m256i ez = _mm256_cmpeq_epi8(e8, z);
#if ZC_VBMI2
    const uint64_t zm = zero_masks<T, true>(w + 32 * b);
    nbuf[b] = uint32_t(zm >> 32);
    nneg += pop(nbuf[b]);
    nz += pop(uint32_t(zm));  // (fields' zero vector holds the same lanes, for zbuf)
#else
    e0acc = _mm256_sub_epi8(e0acc, ez);
    nz += pop(movemask(zero));
#endif
    const __m256i special = _mm256_or_si256(ez, _mm256_cmpeq_epi8(e8, emax));
    sacc = _mm256_add_epi64(sacc, _mm256_sad_epu8(_mm256_andnot_si256(special, e8), z));
    K += 32 - pop(movemask(special));
    _mm256_store_si256(reinterpret_cast<__m256i*>(ebuf + 32 * b), e8);
    _mm256_store_si256(reinterpret_cast<__m256i*>(zbuf + 32 * b), zero);
  }
  alignas(32) uint64_t s4[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(s4), sacc);
  uint64_t S = s4[0] + s4[1] + s4[2] + s4[3];
  _mm256_store_si256(reinterpret_cast<__m256i*>(s4), _mm256_sad_epu8(e0acc, z));
  e0 = s4[0] + s4[1] + s4[2] + s4[3];
  uint32_t low = _mm256_testz_si256(lowacc, lowacc) ? 0 : 1;
  if constexpr (T::kF32) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(s4), _mm256_sad_epu8(low0acc, z));
    low8 = 32 * uint64_t(nb) - (s4[0] + s4[1] + s4[2] + s4[3]);
  }
  for (int i = 32 * nb; i < n; ++i) {
    const uint32_t x = w[i], e = T::exp(x);
    const bool normal = (e - 1u) < (T::kEmax - 1u);
    S += normal ? e : 0;
    K += normal;
    nz += x == 0;
    e0 += e == 0;
    if (T::kF32) low |= x & 0xFFFFu;
    if (T::kF32) low8 += (x & 0xFFu) != 0;
    ebuf[i] = uint8_t(e);
    zbuf[i] = x == 0 ? 0xFF : 0;
  }
  // AVX2: e0 - nz bounds the -0.0 count; the exact count only when that
  // bound reaches the threshold (a second look at the chunk, in cache).
  const int shift = codec == kFixed3 ? kFixedZeroShift : kDenseZeroShift;
  if (ZC_VBMI2) {
    for (int i = 32 * nb; i < n; ++i) nneg += w[i] == T::kSign;
  } else if ((int64_t(e0 - nz) << shift) >= n) {
    for (int b = 0; b < nb; ++b) {
      nbuf[b] = movemask(neg_zero_lanes<T>(w + 32 * b));
      nneg += pop(nbuf[b]);
    }
    for (int i = 32 * nb; i < n; ++i) nneg += w[i] == T::kSign;
  }
  const bool zp = (int64_t(nz) << shift) >= n, zn = (int64_t(nneg) << shift) >= n;
  Entry en{};
  if (int64_t(nz) == n) {  // every element +0.0: a ZERO chunk, its entry zeros
    *n_low = 0;
    en.mode = kModeZero;
    return en;
  }
  en.mode = kModeCoded;
  set_locator(en, S, K);
  if (T::kF32 && low == 0) en.flags |= kFlagLow16;
  en.flags |= (zp ? kFlagZpos : 0) | (zn ? kFlagZneg : 0);
  if (codec == kFixed3) {
    int lo, width;
    fixed_window<T>(en.base, en.phase, zp + zn, &lo, &width);
    const __m256i vlo = _mm256_set1_epi8(char(lo)), vw = _mm256_set1_epi8(char(width - 1));
    uint64_t nesc = 0;
    for (int b = 0; b < nb; ++b) {
      const __m256i e8 = _mm256_load_si256(reinterpret_cast<const __m256i*>(ebuf + 32 * b));
      const __m256i d = _mm256_sub_epi8(e8, vlo);
      uint32_t out = ~movemask(_mm256_cmpeq_epi8(_mm256_min_epu8(d, vw), d));
      if (zp) out &= ~movemask(_mm256_load_si256(reinterpret_cast<const __m256i*>(zbuf + 32 * b)));
      if (zn) out &= ~nbuf[b];
      nesc += pop(out);
    }
    for (int i = 32 * nb; i < n; ++i)
      nesc += (uint32_t(ebuf[i]) - uint32_t(lo)) >= uint32_t(width) && !(zp && zbuf[i]) &&
              !(zn && w[i] == T::kSign);
    en.n_zero = uint16_t((zp ? nz : 0) + (zn ? nneg : 0));
    en.n_esc = uint16_t(nesc);
  } else {
    const DenseRanker rank(en.base, en.phase, zp, zn);
    const __m256i none = _mm256_setzero_si256();
    uint64_t c3 = 0, c4 = 0, c5 = 0, c8 = 0, ce = 0;
    for (int b = 0; b < nb; ++b) {
      const __m256i r =
          rank(_mm256_load_si256(reinterpret_cast<const __m256i*>(ebuf + 32 * b)),
               _mm256_load_si256(reinterpret_cast<const __m256i*>(zbuf + 32 * b)),
               zn ? mask_bytes(nbuf[b]) : none);
      c3 += pop(gt(r, 2));
      c4 += pop(gt(r, 3));
      c5 += pop(gt(r, 4));
      c8 += pop(gt(r, 7));
      ce += pop(gt(r, 10));
    }
    const uint8_t* lut = kLuts.rank[zp][zn][en.phase];
    const int rpos = kLuts.zrank[zp][zn][en.phase][0], rneg = kLuts.zrank[zp][zn][en.phase][1];
    for (int i = 32 * nb; i < n; ++i) {
      const int r = dense_rank<T>(w[i], en.base, lut, rpos, rneg);
      c3 += r >= 3;
      c4 += r >= 4;
      c5 += r >= 5;
      c8 += r >= 8;
      ce += r == kDenseEsc;
    }
    en.n_zero = uint16_t((rpos >= 0 ? nz : 0) + (rneg >= 0 ? nneg : 0));
    en.n_esc = uint16_t(ce);
    en.n_open[0] = uint16_t(c3);
    en.n_open[1] = uint16_t(c4);
    en.n_open[2] = uint16_t(c5);
    en.n_open[3] = uint16_t(c8);
  }
  return lowbyte_or_raw<T>(en, codec, n, low8, n_low);
}

// ---- encode pass 2 ----
// NEG: the chunk codes -0.0 (kFlagZneg); without it the kernels compile to
// what they were before -0.0 had a code.
template <class T, bool NEG>
ZC_AVX2 static void write_fixed3(const typename T::W* w, int n, const Entry& en, uint8_t* codes,
                                 uint8_t* sm, uint8_t* rem, uint8_t* esc, const uint8_t* next,
                                 int64_t next_nbytes) {
  using L = Lanes<T>;
  const bool zp = en.flags & kFlagZpos, low16 = en.flags & kFlagLow16;
  const Zeros zc = fixed_zeros(en.flags);
  const Seg seg = segment_nbytes<T>(kFixed3, en, n);
  // The escapes are compacted into a buffer on the stack, copied to the
  // segment at the end: a chunk's escape stream is a few dozen bytes, so
  // compacting into the segment, whose next bytes belong to another stream,
  // would take put_compact's bounded path (a memcpy call, around which the
  // loop's vector registers are spilled) in most blocks of the chunk. Here
  // every block takes compact32, whose stores may reach 32 bytes past the
  // data: at most kChunkElems + 32 bytes.
  alignas(32) uint8_t escbuf[kChunkElems + 32];
  uint8_t* const esc_out = esc;
  esc = escbuf;
  EncSt st{sm, sm + seg.sm, FastBitWriter(rem, rem + seg.rem), en.n_zero != 0};
  int lo, width;
  fixed_window<T>(en.base, en.phase, zc.z, &lo, &width);
  const __m256i vlo = _mm256_set1_epi8(char(lo)), vw = _mm256_set1_epi8(char(width - 1));
  const __m256i vz = _mm256_set1_epi8(char(zc.z)), v7 = _mm256_set1_epi8(kFixedEsc);
  const __m256i vneg = _mm256_set1_epi8(char(zc.cneg));
  const int nb = n / 32;
  for (int b = 0; b < nb; ++b) {
    __m256i e8, zero;
    typename L::Raw raw;
    prefetch_ahead(w + 32 * b);
    L::fields(w + 32 * b, &e8, &zero, &raw);
    const __m256i d = _mm256_sub_epi8(e8, vlo);  // wraps to >= width below lo
    const __m256i inwin = _mm256_cmpeq_epi8(_mm256_min_epu8(d, vw), d);
    __m256i code = _mm256_blendv_epi8(v7, _mm256_add_epi8(d, vz), inwin);
    uint32_t keep = ~0u;
#if ZC_VBMI2
    if (zp || NEG) {  // the zero lanes as masks (zero_masks), fields' zero unused
      const uint64_t zm = zero_masks<T, NEG>(w + 32 * b);
      const uint32_t pz = uint32_t(zm) & -uint32_t(zp), ng = uint32_t(zm >> 32);
      code = _mm256_maskz_mov_epi8(~pz, code);  // +0.0's code is 0 when it has one
      if constexpr (NEG) code = _mm256_mask_blend_epi8(ng, code, vneg);
      keep = ~(pz | ng);
    }
#else
    if (zp) {  // +0.0's code is 0 when it has one
      code = _mm256_andnot_si256(zero, code);
      keep = ~movemask(zero);
    }
    if constexpr (NEG) {
      const __m256i neg = neg_zero_lanes<T>(w + 32 * b);
      code = _mm256_blendv_epi8(code, vneg, neg);
      keep &= ~movemask(neg);
    }
#endif
    // Not for fp32, whose write loop was measured faster without it.
    if constexpr (!T::kF32) prefetch_next<T>(next, next_nbytes, b);
    store_pack3(codes + 12 * b, code);
    esc = compact32(e8, movemask(_mm256_cmpeq_epi8(code, v7)), esc);
    L::emit(raw, w + 32 * b, keep, low16, st);
  }
  BitWriter cw(codes + 12 * nb);
  EncOut o{st.sm, st.rem.to_scalar(), esc};
  fixed3_encode_range<T>(w, 32 * nb, n, lo, width, zc, low16, cw, o);
  cw.finish();
  o.rem.finish();
  std::memcpy(esc_out, escbuf, size_t(seg.esc));
}

template <class T, bool NEG>
ZC_AVX2 static void write_dense(const typename T::W* w, int n, const Entry& en, uint8_t* codes,
                                uint8_t* sm, uint8_t* rem, uint8_t* esc) {
  using L = Lanes<T>;
  const bool zp = en.flags & kFlagZpos, zn = en.flags & kFlagZneg, low16 = en.flags & kFlagLow16;
  const Seg seg = segment_nbytes<T>(kDense, en, n);
  // The escapes are compacted into a buffer on the stack and copied to the
  // segment at the end, as write_fixed3 does: compacting into the segment
  // would take put_compact's bounded path in every block within 32 bytes of
  // the stream's end, which in a chunk of few escapes that compacts in every
  // block (esc_every_block) is every block.
  alignas(32) uint8_t escbuf[kChunkElems + 32];
  uint8_t* const esc_out = esc;
  esc = escbuf;
  EncSt st{sm, sm + seg.sm, FastBitWriter(rem, rem + seg.rem), en.n_zero != 0};
  const DenseRanker rank(en.base, en.phase, zp, zn);
  const __m256i three = _mm256_set1_epi8(3);
  const uint32_t esc_every_block = esc_every_block_mask(en, n);
  int64_t start[5], len[5];
  dense_tier_segments(en, n, start, len);
  FastBitWriter f1(codes + start[1], codes + start[1] + len[1]),
      f2(codes + start[2], codes + start[2] + len[2]), f3(codes + start[3], codes + start[3] + len[3]),
      f4(codes + start[4], codes + start[4] + len[4]);
  const int nb = n / 32;
  for (int b = 0; b < nb; ++b) {
    __m256i e8, zero;
    typename L::Raw raw;
    prefetch_ahead(w + 32 * b);
    L::fields(w + 32 * b, &e8, &zero, &raw);
    const __m256i neg = NEG ? neg_zero_lanes<T>(w + 32 * b) : _mm256_setzero_si256();
    const __m256i r = rank(e8, zero, neg);
    const uint64_t t0 = pack2(_mm256_min_epu8(r, three));
    std::memcpy(codes + 8 * b, &t0, 8);
    // Bit planes of the rank give each tier's open set and digit bits; tier
    // t's digits go to the elements open there, in order (pext).
    const uint32_t q0 = movemask(_mm256_slli_epi16(r, 7)), q1 = movemask(_mm256_slli_epi16(r, 6)),
                   q2 = movemask(_mm256_slli_epi16(r, 5)), q3 = movemask(_mm256_slli_epi16(r, 4));
    const uint32_t ge4 = q3 | q2, ge3 = ge4 | (q1 & q0), ge5 = q3 | (q2 & (q1 | q0));
    f1.put(_pext_u32(ge4, ge3), pop(ge3));
    f2.put(_pext_u32(ge5, ge4), pop(ge4));
    // tier 3 digit (rank 5..7, 8+ = continue): low bit on 6 and 8+, high bit on 7+
    const uint64_t l3 = _pext_u32(q3 | (q2 & q1 & ~q0), ge5), h3 = _pext_u32(q3 | (q2 & q1 & q0), ge5);
    f3.put64(_pdep_u64(l3, kEven) | _pdep_u64(h3, kOdd), 2 * pop(ge5));
    // tier 4 digit: rank - 8 (11 = ESC)
    const uint64_t l4 = _pext_u32(q0, q3), h4 = _pext_u32(q1, q3);
    f4.put64(_pdep_u64(l4, kEven) | _pdep_u64(h4, kOdd), 2 * pop(q3));
    const uint32_t escm = q3 & q1 & q0;  // see kEscEveryBlock
    if (esc_every_block | escm) esc = compact32(e8, escm, esc);
    L::emit(raw, w + 32 * b, ~movemask(rank.coded(zero, neg)), low16, st);  // no sm for a zero symbol
  }
  BitWriter tw[5] = {BitWriter(codes + 8 * nb), f1.to_scalar(), f2.to_scalar(), f3.to_scalar(),
                     f4.to_scalar()};
  EncOut o{st.sm, st.rem.to_scalar(), esc};
  dense_encode_range<T>(w, 32 * nb, n, en.base, kLuts.rank[zp][zn][en.phase],
                        kLuts.zrank[zp][zn][en.phase][0], kLuts.zrank[zp][zn][en.phase][1], low16,
                        tw, o);
  for (auto& t : tw) t.finish();
  o.rem.finish();
  std::memcpy(esc_out, escbuf, size_t(seg.esc));
}

// ---- decode ----
template <class T, bool NEG>
ZC_AVX2 static int decode_fixed3(const Entry& en, int n, const uint8_t* codes, DecIn& in,
                                 typename T::W* out, const uint8_t* next, int64_t next_nbytes) {
  using L = Lanes<T>;
  const bool zp = en.flags & kFlagZpos, low16 = en.flags & kFlagLow16;
  const Zeros zc = fixed_zeros(en.flags);
  int lo, width;
  fixed_window<T>(en.base, en.phase, zc.z, &lo, &width);
  const __m256i vlo = _mm256_set1_epi8(char(lo - zc.z)), v7 = _mm256_set1_epi8(kFixedEsc);
  const __m256i z = _mm256_setzero_si256();
  const __m256i vz = _mm256_set1_epi8(char(zc.z)), vneg = _mm256_set1_epi8(char(zc.cneg));
  FastBitReader rr(in.rem.p, in.end);
  in.omits = en.n_zero != 0;
  const int nb = n / 32;
  for (int b = 0; b < nb; ++b) {
    prefetch_next<T>(next, next_nbytes, b);
    const __m256i code = unpack3(codes + 12 * b);
    const __m256i escv = _mm256_cmpeq_epi8(code, v7);
    // Codes below z are zeros; -0.0's is cneg (+0.0's, when it has one, 0).
    const __m256i zero = NEG ? _mm256_cmpgt_epi8(vz, code) : zp ? _mm256_cmpeq_epi8(code, z) : z;
    const __m256i neg = NEG ? _mm256_cmpeq_epi8(code, vneg) : z;
    const uint32_t zm = movemask(zero);
    __m256i ex;
    if (int err = take_esc<T>(in, movemask(escv), &ex)) return err;
    in.n_zero += pop(zm);
    // e = lo + code - z; bytes wrap only on lanes the masks replace
    const __m256i e8 = _mm256_or_si256(_mm256_andnot_si256(escv, _mm256_add_epi8(code, vlo)), ex);
    if (int err = L::assemble(e8, zero, neg, ~zm, low16, in, rr, out + 32 * b)) return err;
  }
  in.rem = rr.to_scalar(in.rem.end);
  BitReader cr(codes + 12 * nb, packed_nbytes(n, kFixedBits) - 12 * nb);
  if (int err = fixed3_decode_range<T>(32 * nb, n, lo, zc, low16, cr, in, out))
    return err;
  return count_checks(in, en);
}

template <class T, bool NEG>
ZC_AVX2 static int decode_dense(const Entry& en, int n, const uint8_t* codes, DecIn& in,
                                typename T::W* out) {
  using L = Lanes<T>;
  const bool zp = en.flags & kFlagZpos, zn = en.flags & kFlagZneg, low16 = en.flags & kFlagLow16;
  const int8_t* sym = kLuts.sym[zp][zn][en.phase];
  in.omits = en.n_zero != 0;
  // Per rank: the exponent byte, and 0x80 where base + symbol leaves [0, emax].
  alignas(32) uint8_t te[32], tb[32];
  for (int r = 0; r < 16; ++r) {
    const int s = r < kDenseSlots ? sym[r] : kZeroSymbol;
    const int e = int(en.base) + s;
    te[r] = te[r + 16] = uint8_t(e);
    const bool zero_symbol = s == kZeroSymbol || s == kNegZeroSymbol;
    tb[r] = tb[r + 16] = (!zero_symbol && (e < 0 || e > int(T::kEmax))) ? 0x80 : 0;
  }
  const __m256i lut_e = _mm256_load_si256(reinterpret_cast<const __m256i*>(te));
  const __m256i lut_bad = _mm256_load_si256(reinterpret_cast<const __m256i*>(tb));
  // Ranks of +0.0 and -0.0 (-1, never a rank, where the table has none).
  const __m256i rpos = _mm256_set1_epi8(kLuts.zrank[zp][zn][en.phase][0]);
  const __m256i rneg = _mm256_set1_epi8(kLuts.zrank[zp][zn][en.phase][1]);
  int64_t start[5], len[5];
  dense_tier_segments(en, n, start, len);
  FastBitReader f1(codes + start[1], in.end), f2(codes + start[2], in.end),
      f3(codes + start[3], in.end), f4(codes + start[4], in.end), rr(in.rem.p, in.end);
  int left[4] = {en.n_open[0], en.n_open[1], en.n_open[2], en.n_open[3]};
  uint32_t bad = 0;
  const uint32_t esc_every_block = esc_every_block_mask(en, n);
  const int nb = n / 32;
  for (int b = 0; b < nb; ++b) {
    prefetch_ahead(in.sm);
    prefetch_ahead(codes + 8 * b);
    uint64_t v0;
    std::memcpy(&v0, codes + 8 * b, 8);
    const uint32_t l0 = uint32_t(_pext_u64(v0, kEven)), h0 = uint32_t(_pext_u64(v0, kOdd));
    // Tier t's digits land on the elements still open there (pdep); every
    // tier is read even when nothing is open (no data-dependent branches).
    const uint32_t m1 = l0 & h0;
    if ((left[0] -= pop(m1)) < 0) return kErrOpen;
    const uint32_t b1 = _pdep_u32(uint32_t(f1.get(pop(m1))), m1);
    if ((left[1] -= pop(b1)) < 0) return kErrOpen;
    const uint32_t b2 = _pdep_u32(uint32_t(f2.get(pop(b1))), b1);
    if ((left[2] -= pop(b2)) < 0) return kErrOpen;
    const uint64_t v3 = f3.get64(2 * pop(b2));
    const uint32_t l3 = _pdep_u32(uint32_t(_pext_u64(v3, kEven)), b2);
    const uint32_t h3 = _pdep_u32(uint32_t(_pext_u64(v3, kOdd)), b2);
    const uint32_t m4 = l3 & h3;
    if ((left[3] -= pop(m4)) < 0) return kErrOpen;
    const uint64_t v4 = f4.get64(2 * pop(m4));
    const uint32_t l4 = _pdep_u32(uint32_t(_pext_u64(v4, kEven)), m4);
    const uint32_t h4 = _pdep_u32(uint32_t(_pext_u64(v4, kOdd)), m4);
    // Bit planes of the rank: tier 0 exits 0..2; tier 1: 3; tier 2: 4;
    // tier 3: 5 + d (0b01xx); tier 4: 8 + d (0b10xx, 11 = ESC).
    const uint32_t x0 = ~m1, x1 = m1 & ~b1, x2 = b1 & ~b2, x3 = b2 & ~m4;
    const uint32_t r0 = (x0 & l0) | x1 | (x3 & ~l3) | (m4 & l4);
    const uint32_t r1 = (x0 & h0) | x1 | (x3 & (l3 | h3)) | (m4 & h4);
    const uint32_t r2 = x2 | x3;
    const __m256i r = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(mask_bytes(r0), _mm256_set1_epi8(1)),
                        _mm256_and_si256(mask_bytes(r1), _mm256_set1_epi8(2))),
        _mm256_or_si256(_mm256_and_si256(mask_bytes(r2), _mm256_set1_epi8(4)),
                        _mm256_and_si256(mask_bytes(m4), _mm256_set1_epi8(8))));
    bad |= movemask(_mm256_shuffle_epi8(lut_bad, r));
    const __m256i neg = NEG ? _mm256_cmpeq_epi8(r, rneg) : _mm256_setzero_si256();
    const __m256i zero = _mm256_or_si256(_mm256_cmpeq_epi8(r, rpos), neg);
    const uint32_t zm = movemask(zero);
    __m256i e8 = _mm256_shuffle_epi8(lut_e, r);
    const uint32_t escm = m4 & l4 & h4;
    if (esc_every_block | escm) {  // see esc_every_block_mask
      __m256i ex;
      if (int err = take_esc<T>(in, escm, &ex)) return err;
      e8 = _mm256_or_si256(_mm256_andnot_si256(mask_bytes(escm), e8), ex);
    }
    in.n_zero += pop(zm);
    if (int err = L::assemble(e8, zero, neg, ~zm, low16, in, rr, out + 32 * b)) return err;
  }
  if (bad) return kErrExponent;
  in.rem = rr.to_scalar(in.rem.end);
  BitReader tr[5] = {BitReader(codes + 8 * nb, len[0] - 8 * nb),
                     f1.to_scalar(codes + start[1] + len[1]), f2.to_scalar(codes + start[2] + len[2]),
                     f3.to_scalar(codes + start[3] + len[3]), f4.to_scalar(codes + start[4] + len[4])};
  if (int err = dense_decode_range<T>(32 * nb, n, en.base, sym, low16, tr, left, in, out))
    return err;
  if (int err = dense_tail_checks(left)) return err;
  return count_checks(in, en);
}

// ---- checksum ----
ZC_AVX2 static inline __m256i mix8(__m256i w, __m256i key) {
  __m256i h = _mm256_mullo_epi32(_mm256_xor_si256(w, key), _mm256_set1_epi32(int(kSumMul1)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(int(kSumMul2)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// run_sum_generic on 16 elements a step: the keys are i * kSumKeyMul + the
// dtype's term (i < 2**16 has no bit in common with code << 16), so they step
// by a constant. Two accumulators give the two mullo chains room to overlap.
template <class T>
ZC_AVX2 static uint32_t run_sum(const typename T::W* w, int n) {
  const __m256i step = _mm256_set1_epi32(int(8 * kSumKeyMul));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i key = _mm256_add_epi32(_mm256_mullo_epi32(lane, _mm256_set1_epi32(int(kSumKeyMul))),
                                 _mm256_set1_epi32(int((uint32_t(T::kCode) << 16) * kSumKeyMul)));
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i w0, w1;
    if (T::kItem == 2) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i));
      w0 = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(v));
      w1 = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1));
    } else {
      w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i));
      w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i + 8));
    }
    acc0 = _mm256_add_epi32(acc0, mix8(w0, key));
    key = _mm256_add_epi32(key, step);
    acc1 = _mm256_add_epi32(acc1, mix8(w1, key));
    key = _mm256_add_epi32(key, step);
  }
  const __m256i acc = _mm256_add_epi32(acc0, acc1);
  __m128i a = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0x4E));
  a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0xB1));
  return uint32_t(_mm_cvtsi128_si32(a)) + run_sum_generic<T>(w, i, n);
}

// ---- LOWBYTE's streams (the generic lowbyte_split and lowbyte_hi, 8 groups
// and 32 words a step; the group buffer has 64 bytes of room past its data
// for the sloppy loads and stores) ----
ZC_AVX2 static int64_t lowbyte_split(const uint8_t* g, int64_t k, const uint32_t* w, int64_t n,
                                     uint8_t* hi, uint8_t* bm, uint8_t* low) {
  // hi: bytes 1, 2 of 8 groups (24 bytes, 12 a lane) to 16 bytes.
  const __m256i split = _mm256_setr_epi32(0, 1, 2, 2, 3, 4, 5, 5);
  const __m256i pick = _mm256_setr_epi8(1, 2, 4, 5, 7, 8, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1,
                                        1, 2, 4, 5, 7, 8, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 3 * i));
    const __m256i x = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(raw, split), pick);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + 2 * i),
                     _mm256_castsi256_si128(_mm256_permute4x64_epi64(x, 0x08)));
  }
  for (; i < k; ++i) {
    hi[2 * i] = g[3 * i + 1];
    hi[2 * i + 1] = g[3 * i + 2];
  }
  // The bitmap, 4 bytes a step, and the nonzero low bytes compacted into a
  // buffer (compact32 stores past its data), copied to low at the end.
  alignas(32) uint8_t buf[kChunkElems + 32];
  uint8_t* lp = buf;
  const __m256i ff = _mm256_set1_epi32(0xFF), zz = _mm256_setzero_si256();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    __m256i v[4];
    uint32_t zm = 0;
    for (int q = 0; q < 4; ++q) {
      v[q] = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j + 8 * q)),
                              ff);
      zm |= uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v[q], zz))))
            << (8 * q);
    }
    const uint32_t m = ~zm;
    std::memcpy(bm + j / 8, &m, 4);
    if (m) lp = compact32(Lanes<FP32>::pack32(v, false), m, lp);
  }
  for (; j < n; j += 8) lp = low_row(w + j, std::min<int64_t>(8, n - j), bm + j / 8, lp);
  const int64_t n_low = lp - buf;
  std::memcpy(low, buf, size_t(n_low));
  std::memset(low + n_low, 0, size_t(align16(n_low) - n_low));
  return n_low;
}

ZC_AVX2 static void lowbyte_hi(const uint8_t* hi, int64_t k, uint8_t* g) {
  // 16 bytes of hi (8 groups) spread to 24, a zero byte before each pair.
  const __m256i spread = _mm256_setr_epi8(-1, 0, 1, -1, 2, 3, -1, 4, 5, -1, 6, 7, -1, 8, 9, -1,
                                          10, 11, -1, 12, 13, -1, 14, 15, -1, -1, -1, -1, -1, -1,
                                          -1, -1);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256i x = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + 2 * i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(g + 3 * i), _mm256_shuffle_epi8(x, spread));
  }
  for (; i < k; ++i) {
    g[3 * i] = 0;
    g[3 * i + 1] = hi[2 * i];
    g[3 * i + 2] = hi[2 * i + 1];
  }
}

}  // namespace avx2 / avx512
#undef ZC_AVX2
#undef ZC_VBMI2
#endif

#ifdef ZIPCCL_HAVE_VBMI2_KERNELS
// The VBMI2 build's kernels, defined (as avx512::*'s) in codec_vbmi2.cpp's
// translation unit.
namespace vbmi2 {
template <class T>
Entry analyze(const typename T::W* w, int n, int codec, int* n_low);
template <class T, bool NEG>
void write_fixed3(const typename T::W* w, int n, const Entry& en, uint8_t* codes, uint8_t* sm,
                  uint8_t* rem, uint8_t* esc, const uint8_t* next, int64_t next_nbytes);
template <class T, bool NEG>
void write_dense(const typename T::W* w, int n, const Entry& en, uint8_t* codes, uint8_t* sm,
                 uint8_t* rem, uint8_t* esc);
template <class T, bool NEG>
int decode_fixed3(const Entry& en, int n, const uint8_t* codes, DecIn& in, typename T::W* out,
                  const uint8_t* next, int64_t next_nbytes);
template <class T, bool NEG>
int decode_dense(const Entry& en, int n, const uint8_t* codes, DecIn& in, typename T::W* out);
template <class T>
uint32_t run_sum(const typename T::W* w, int n);

#ifdef ZIPCCL_VBMI2_PASS
template <class T>
Entry analyze(const typename T::W* w, int n, int codec, int* n_low) {
  return avx512::analyze<T>(w, n, codec, n_low);
}
template <class T, bool NEG>
void write_fixed3(const typename T::W* w, int n, const Entry& en, uint8_t* codes, uint8_t* sm,
                  uint8_t* rem, uint8_t* esc, const uint8_t* next, int64_t next_nbytes) {
  avx512::write_fixed3<T, NEG>(w, n, en, codes, sm, rem, esc, next, next_nbytes);
}
template <class T, bool NEG>
void write_dense(const typename T::W* w, int n, const Entry& en, uint8_t* codes, uint8_t* sm,
                 uint8_t* rem, uint8_t* esc) {
  avx512::write_dense<T, NEG>(w, n, en, codes, sm, rem, esc);
}
template <class T, bool NEG>
int decode_fixed3(const Entry& en, int n, const uint8_t* codes, DecIn& in, typename T::W* out,
                  const uint8_t* next, int64_t next_nbytes) {
  return avx512::decode_fixed3<T, NEG>(en, n, codes, in, out, next, next_nbytes);
}
template <class T, bool NEG>
int decode_dense(const Entry& en, int n, const uint8_t* codes, DecIn& in, typename T::W* out) {
  return avx512::decode_dense<T, NEG>(en, n, codes, in, out);
}
template <class T>
uint32_t run_sum(const typename T::W* w, int n) {
  return avx512::run_sum<T>(w, n);
}
#define ZC_VBMI2_NEG(T, NEG)                                                                     \
  template void write_fixed3<T, NEG>(const T::W*, int, const Entry&, uint8_t*, uint8_t*,         \
                                     uint8_t*, uint8_t*, const uint8_t*, int64_t);               \
  template void write_dense<T, NEG>(const T::W*, int, const Entry&, uint8_t*, uint8_t*,          \
                                    uint8_t*, uint8_t*);                                         \
  template int decode_fixed3<T, NEG>(const Entry&, int, const uint8_t*, DecIn&, T::W*,           \
                                     const uint8_t*, int64_t);                                   \
  template int decode_dense<T, NEG>(const Entry&, int, const uint8_t*, DecIn&, T::W*);
#define ZC_VBMI2_DTYPE(T)                                                                        \
  template Entry analyze<T>(const T::W*, int, int, int*);                                        \
  template uint32_t run_sum<T>(const T::W*, int);                                                \
  ZC_VBMI2_NEG(T, false)                                                                         \
  ZC_VBMI2_NEG(T, true)
ZC_VBMI2_DTYPE(BF16)
ZC_VBMI2_DTYPE(FP16)
ZC_VBMI2_DTYPE(FP32)
#endif  // ZIPCCL_VBMI2_PASS
}  // namespace vbmi2
#endif  // ZIPCCL_HAVE_VBMI2_KERNELS

#ifdef ZIPCCL_VBMI2_PASS
}  // namespace zipccl
#else  // the rest: codec.cpp's own translation unit only

// 0: generic, 1: AVX2 + BMI2 (not on AMD before Zen 3, whose pdep/pext are
// microcoded), 2: that and AVX-512 BW/VL/VBMI2 (with the OS saving the
// AVX-512 state, which __builtin_cpu_supports checks).
static int best_isa() {
  int best = 0;
#ifdef ZIPCCL_HAVE_AVX2_KERNELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
      !__builtin_cpu_is("znver1") && !__builtin_cpu_is("znver2"))
    best = 1;
#endif
#ifdef ZIPCCL_HAVE_VBMI2_KERNELS
  if (best == 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi2"))
    best = 2;
#endif
  return best;
}

// --------------------------------------------------------------------------
// Per-chunk dispatch and the passes over chunks
// --------------------------------------------------------------------------
template <class T>
static inline Entry analyze_dispatch(const typename T::W* w, int n, int codec, int isa,
                                     int* n_low) {
#ifdef ZIPCCL_HAVE_VBMI2_KERNELS
  if (isa >= 2) return vbmi2::analyze<T>(w, n, codec, n_low);
#endif
#ifdef ZIPCCL_HAVE_AVX2_KERNELS
  if (isa >= 1) return avx2::analyze<T>(w, n, codec, n_low);
#endif
  (void)isa;
  return analyze_chunk<T>(w, n, codec, n_low);
}

template <class T>
static inline void write_dispatch(const typename T::W* w, int n, int codec, const Entry& en,
                                  uint8_t* codes, uint8_t* sm, uint8_t* rem, uint8_t* esc,
                                  const uint8_t* next, int64_t next_nbytes, int isa) {
#ifdef ZIPCCL_HAVE_VBMI2_KERNELS
  if (isa >= 2 && en.mode == kModeCoded) {
    const bool neg = en.flags & kFlagZneg;
    if (codec == kFixed3)
      (neg ? vbmi2::write_fixed3<T, true> : vbmi2::write_fixed3<T, false>)(
          w, n, en, codes, sm, rem, esc, next, next_nbytes);
    else
      (neg ? vbmi2::write_dense<T, true> : vbmi2::write_dense<T, false>)(w, n, en, codes, sm,
                                                                           rem, esc);
    return;
  }
#endif
#ifdef ZIPCCL_HAVE_AVX2_KERNELS
  if (isa >= 1 && en.mode == kModeCoded) {
    const bool neg = en.flags & kFlagZneg;
    if (codec == kFixed3)
      (neg ? avx2::write_fixed3<T, true> : avx2::write_fixed3<T, false>)(w, n, en, codes, sm, rem,
                                                                         esc, next, next_nbytes);
    else
      (neg ? avx2::write_dense<T, true> : avx2::write_dense<T, false>)(w, n, en, codes, sm, rem,
                                                                       esc);
    return;
  }
#endif
  (void)isa, (void)next, (void)next_nbytes;
  write_chunk<T>(w, n, codec, en, codes, sm, rem, esc);
}

template <class T>
static inline int decode_dispatch(int codec, const Entry& en, int n, const uint8_t* codes,
                                  DecIn& in, typename T::W* out, const uint8_t* next,
                                  int64_t next_nbytes, int isa) {
#ifdef ZIPCCL_HAVE_VBMI2_KERNELS
  if (isa >= 2) {
    const bool neg = en.flags & kFlagZneg;
    if (codec == kFixed3)
      return (neg ? vbmi2::decode_fixed3<T, true> : vbmi2::decode_fixed3<T, false>)(
          en, n, codes, in, out, next, next_nbytes);
    return (neg ? vbmi2::decode_dense<T, true> : vbmi2::decode_dense<T, false>)(en, n, codes,
                                                                                  in, out);
  }
#endif
#ifdef ZIPCCL_HAVE_AVX2_KERNELS
  if (isa >= 1) {
    const bool neg = en.flags & kFlagZneg;
    if (codec == kFixed3)
      return (neg ? avx2::decode_fixed3<T, true> : avx2::decode_fixed3<T, false>)(
          en, n, codes, in, out, next, next_nbytes);
    return (neg ? avx2::decode_dense<T, true> : avx2::decode_dense<T, false>)(en, n, codes, in,
                                                                              out);
  }
#endif
  (void)isa, (void)next, (void)next_nbytes;
  return decode_chunk_generic<T>(codec, en, n, codes, in, out);
}

template <class T>
static inline uint32_t sum_dispatch(const typename T::W* w, int n, int isa) {
#ifdef ZIPCCL_HAVE_VBMI2_KERNELS
  if (isa >= 2) return vbmi2::run_sum<T>(w, n);
#endif
#ifdef ZIPCCL_HAVE_AVX2_KERNELS
  if (isa >= 1) return avx2::run_sum<T>(w, n);
#endif
  (void)isa;
  return run_sum_generic<T>(w, 0, n);
}

static inline void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// A call with fewer chunks stays on one thread: their work on one core is a
// few times OpenMP's fork/join.
constexpr int64_t kMinParallelChunks = 8;
// Threads take chunks in runs of this many (dynamic schedule): with a static
// split, a thread that loses its core to another process holds up the whole
// call.
constexpr int kChunksPerGrab = 16;

// Whether chunk c + 1 is taken by the thread that takes chunk c: in the
// parallel loops, chunks go in runs of kChunksPerGrab.
static inline bool next_is_mine(int64_t c, int64_t nch, int nthreads) {
  return c + 1 < nch &&
         (nthreads == 1 || nch < kMinParallelChunks || (c + 1) % kChunksPerGrab != 0);
}

static inline int chunk_len(int64_t numel, int64_t C, int64_t c) {
  return int(std::min<int64_t>(C, numel - c * C));
}

// A chunk's sub-stream starts inside its segment (codes at 0) and the padded
// segment size (format.segment_layout).
struct Layout {
  int64_t sm, rem, esc, low, size;
};
template <class T>
static inline Layout segment_layout(int codec, const Entry& en, int64_t n, Seg* lens,
                                    int64_t n_low = 0) {
  const Seg s = segment_nbytes<T>(codec, en, n, n_low);
  if (lens) *lens = s;
  Layout l;
  l.sm = align16(s.codes);
  l.rem = l.sm + align16(s.sm);
  l.esc = l.rem + align16(s.rem);
  l.low = l.esc + align16(s.esc);
  l.size = l.low + align16(s.low);
  return l;
}

// LOWBYTE chunks (format.py, "LOWBYTE") are coded by every kernel set as
// chunks of 3-byte sm groups, written to (encode) or read from (decode) a
// buffer: the kernels stay those of the other chunks. lowbyte_split makes the
// chunk's sm (bytes 1, 2 of each group), bitmap and low streams of the groups
// and the words; lowbyte_hi and lowbyte_patch go back.
//
// The groups g of k kept elements to hi; the bitmap bm of the n words w (bit
// i: w[i]'s low byte is not zero) and those bytes in order to low, whose
// padding is zeroed. Returns low's length.
static int64_t lowbyte_split(const uint8_t* g, int64_t k, const uint32_t* w, int64_t n,
                             uint8_t* hi, uint8_t* bm, uint8_t* low) {
  for (int64_t i = 0; i < k; ++i) {
    hi[2 * i] = g[3 * i + 1];
    hi[2 * i + 1] = g[3 * i + 2];
  }
  uint8_t* const low0 = low;
  for (int64_t i0 = 0; i0 < n; i0 += 8)
    low = low_row(w + i0, std::min<int64_t>(8, n - i0), bm + (i0 >> 3), low);
  const int64_t n_low = low - low0;
  std::memset(low, 0, size_t(align16(n_low) - n_low));
  return n_low;
}

// The k groups of a LOWBYTE chunk's sm stream hi, low bytes 0, into g.
static void lowbyte_hi(const uint8_t* hi, int64_t k, uint8_t* g) {
  for (int64_t i = 0; i < k; ++i) {
    g[3 * i] = 0;
    g[3 * i + 1] = hi[2 * i];
    g[3 * i + 2] = hi[2 * i + 1];
  }
}

// The next byte of low ORed into each of the n decoded words whose bitmap
// bit is set (low holds exactly the set bits below n: checked by the caller).
static void lowbyte_patch(const uint8_t* bm, const uint8_t* low, int64_t n, uint32_t* out) {
  for (int64_t i0 = 0; i0 < n; i0 += 64) {
    uint64_t bits = 0;
    std::memcpy(&bits, bm + i0 / 8, size_t(std::min<int64_t>(8, (n - i0 + 7) / 8)));
    for (; bits; bits &= bits - 1) out[i0 + __builtin_ctzll(bits)] |= *low++;
  }
}

// Of a LOWBYTE chunk's bitmap of n bits (ceil(n / 8) bytes): its set bits
// below n, and in *bad whether a padding bit (n on) is set.
static int64_t bitmap_count(const uint8_t* bm, int64_t n, bool* bad) {
  int64_t c = 0, i = 0;
  for (; i + 64 <= n; i += 64) {
    uint64_t v;
    std::memcpy(&v, bm + i / 8, 8);
    c += __builtin_popcountll(v);
  }
  for (; i + 8 <= n; i += 8) c += __builtin_popcount(bm[i / 8]);
  *bad = false;
  if (i < n) {
    const uint32_t last = bm[i / 8], keep = (1u << (n - i)) - 1;
    c += __builtin_popcount(last & keep);
    *bad = (last & ~keep) != 0;
  }
  return c;
}

// Encode pass 1: every chunk's entry, then each segment's byte offset in the
// body (off, nchunks values: the exclusive prefix sum of padded sizes).
// Returns the body size.
template <class T>
static int64_t plan_impl(const typename T::W* w, int64_t numel, int codec, Entry* ent,
                         int64_t* off, int nthreads, int isa) {
  const int64_t C = kChunkElems, nch = (numel + C - 1) / C;
#pragma omp parallel for schedule(dynamic, kChunksPerGrab) num_threads(nthreads) if (nch >= kMinParallelChunks)
  for (int64_t c = 0; c < nch; ++c) {
    const int n = chunk_len(numel, C, c);
    int n_low;
    ent[c] = analyze_dispatch<T>(w + c * C, n, codec, isa, &n_low);
    // (the scan below makes it an offset)
    off[c] = segment_layout<T>(codec, ent[c], n, nullptr, n_low).size;
  }
  int64_t at = 0;
  for (int64_t c = 0; c < nch; ++c) {
    const int64_t size = off[c];
    off[c] = at;
    at += size;
  }
  return at;
}

// The padding after a sub-stream of len bytes lies in the one 16-byte block at
// len & ~15 (none when len is a multiple of 16): its bytes from len & 15 on.
// pad_ok reads that block as two little-endian words, a fixed cost per
// sub-stream in place of a byte loop.
static inline uint64_t low_bytes_mask(int64_t k) {  // bytes [0, k) of a word, k in [0, 8]
  return k >= 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * k)) - 1;
}

// Whether bytes [p + len, p + align16(len)) are zero.
static inline bool pad_ok(const uint8_t* p, int64_t len) {
  const int64_t t = len & (kAlign - 1);
  if (!t) return true;
  uint64_t w[2];
  std::memcpy(w, p + (len - t), 16);
  return !((w[0] & ~low_bytes_mask(t)) | (w[1] & ~low_bytes_mask(t - 8 < 0 ? 0 : t - 8)));
}

// Zero the 16-byte block that holds the padding after a sub-stream of len
// bytes (none when len is a multiple of 16), before the stream is written:
// every chunk writer stores exactly its stream's bytes, none past its end,
// so the padding stays zero and the data overwrites the rest of the block.
// A store ahead of the data, not a load and store after it (which would
// wait for the data's stores to reach the cache).
static inline void zero_last_block(uint8_t* p, int64_t len) {
  if (len & (kAlign - 1)) std::memset(p + (len & ~int64_t(kAlign - 1)), 0, kAlign);
}

// Encode pass 2: the table, offsets and every chunk's segment at its offset,
// padding zeroed. With sums (not null), also each chunk's checksum, while the
// chunk is in cache (encode chunks are kChunkElems long, the checksum's run).
template <class T>
static void write_impl(const typename T::W* w, int64_t numel, int codec, const Entry* ent,
                       const int64_t* off, uint8_t* p, int64_t table, int64_t body,
                       uint8_t* sums, int nthreads, int isa) {
  const int64_t C = kChunkElems, nch = (numel + C - 1) / C;
  std::memcpy(p + table, ent, size_t(kEntryBytes) * nch);
  uint8_t* offs = p + table + kEntryBytes * nch;
  for (int64_t c = 0; c < nch; ++c) store_u32(offs + kOffsetBytes * c, uint32_t(off[c] / kAlign));
  std::memset(offs + kOffsetBytes * nch, 0, size_t(body - table - (kEntryBytes + kOffsetBytes) * nch));
  uint8_t* b = p + body;
#pragma omp parallel for schedule(dynamic, kChunksPerGrab) num_threads(nthreads) if (nch >= kMinParallelChunks)
  for (int64_t c = 0; c < nch; ++c) {
    const int n = chunk_len(numel, C, c);
    Seg s;
    const Layout l = segment_layout<T>(codec, ent[c], n, &s);
    uint8_t* seg = b + off[c];
    if (sums) store_u32(sums + 4 * c, sum_dispatch<T>(w + c * C, n, isa));
    zero_last_block(seg, s.codes);
    zero_last_block(seg + l.sm, s.sm);
    zero_last_block(seg + l.rem, s.rem);
    zero_last_block(seg + l.esc, s.esc);  // (low: lowbyte_split zeroes its padding)
    // Prefetched by the encoder: only a segment this thread writes next (a
    // line that another core is writing would bounce between the two).
    const bool mine = next_is_mine(c, nch, nthreads);
    const uint8_t* next = mine ? b + off[c + 1] : nullptr;
    // (A prefetch hint: a LOWBYTE chunk's size less its low stream.)
    const int64_t next_nbytes =
        mine ? segment_layout<T>(codec, ent[c + 1], chunk_len(numel, C, c + 1), nullptr).size : 0;
    bool split = false;
    if constexpr (T::kF32) {
      if (ent[c].flags & kFlagLowbyte) {
        // The kernels write 3-byte groups (the entry without LOWBYTE) to a
        // buffer; lowbyte_split makes the chunk's streams of them.
        Entry e3 = ent[c];
        e3.flags &= ~kFlagLowbyte;
        alignas(32) uint8_t groups[3 * kChunkElems + 64];
        write_dispatch<T>(w + c * C, n, codec, e3, seg, groups, nullptr, seg + l.esc, next,
                          next_nbytes, isa);
        const int64_t k = n - e3.n_zero;
#ifdef ZIPCCL_HAVE_AVX2_KERNELS
        if (isa >= 1)
          avx2::lowbyte_split(groups, k, w + c * C, n, seg + l.sm, seg + l.rem, seg + l.low);
        else
#endif
          lowbyte_split(groups, k, w + c * C, n, seg + l.sm, seg + l.rem, seg + l.low);
        split = true;
      }
    }
    if (!split)
      write_dispatch<T>(w + c * C, n, codec, ent[c], seg, seg + l.sm, seg + l.rem, seg + l.esc,
                        next, next_nbytes, isa);
  }
}

// The checksums of a whole tensor (one u32 per kChunkElems, little-endian).
template <class T>
static void sums_impl(const typename T::W* w, int64_t numel, uint8_t* sums, int nthreads,
                      int isa) {
  const int64_t C = kChunkElems, nch = (numel + C - 1) / C;
#pragma omp parallel for schedule(dynamic, kChunksPerGrab) num_threads(nthreads) if (nch >= kMinParallelChunks)
  for (int64_t c = 0; c < nch; ++c)
    store_u32(sums + 4 * c, sum_dispatch<T>(w + c * C, chunk_len(numel, C, c), isa));
}

// format.validate_table's rules for one entry. codec_cpp.py relies on them
// instead of running format.py's torch version per call (too slow for a hot
// path); tests/test_cpp_codec.py checks that both refuse the same tables.
template <class T>
static bool entry_ok(int codec, const Entry& en, int64_t n) {
  if (en.mode > kModeZero || en.phase > 3 || en.base > T::kEmax) return false;
  if (en.flags & ~(kFlagLow16 | kFlagZpos | kFlagZneg | kFlagLowbyte)) return false;
  if (!T::kF32 && (en.flags & (kFlagLow16 | kFlagLowbyte))) return false;
  if ((en.flags & (kFlagLow16 | kFlagLowbyte)) == (kFlagLow16 | kFlagLowbyte)) return false;
  if (en.n_zero > n || en.n_esc > n) return false;
  if (en.mode != kModeCoded)  // RAW and ZERO: the mode and zeros
    return !(en.base | en.phase | en.flags | en.n_zero | en.n_esc | en.n_open[0] | en.n_open[1] |
             en.n_open[2] | en.n_open[3]);
  if (codec == kFixed3) {
    if (en.n_open[0] | en.n_open[1] | en.n_open[2] | en.n_open[3]) return false;
    if (!(en.flags & (kFlagZpos | kFlagZneg)) && en.n_zero) return false;
  } else {
    const int64_t chain[6] = {n, en.n_open[0], en.n_open[1], en.n_open[2], en.n_open[3], en.n_esc};
    for (int k = 1; k < 6; ++k)
      if (chain[k] > chain[k - 1]) return false;
  }
  return true;
}

// The first kHeadBytes of a segment's codes and sign+mantissa streams, asked
// for before the chunk decoder starts: its own prefetches run kHeadBytes
// ahead of where it reads, so without these the head of each stream of each
// chunk would be fetched on demand, a line at a time.
constexpr int kHeadBytes = 1024;
static inline void prefetch_head(const uint8_t* codes, const uint8_t* sm, int64_t ncodes,
                                 int64_t nsm) {
#if defined(__GNUC__)
  for (int64_t k = 0; k < std::min<int64_t>(ncodes, kHeadBytes); k += 64)
    __builtin_prefetch(codes + k);
  for (int64_t k = 0; k < std::min<int64_t>(nsm, kHeadBytes); k += 64) __builtin_prefetch(sm + k);
#endif
}

// With sums (not null), also the checksums of what was decoded: per chunk
// while it is in cache when chunks are the checksum's runs (every encoder
// writes those), else in a second pass.
//
// Every check is made by the chunk it concerns, inside the parallel loop (no
// serial pass over the table): its entry (entry_ok), its offset against the
// next one (or, for the last chunk, against the body length) and the segment
// size the entry implies, which together are the prefix-sum rule of
// format.py; then its padding, then its data. A chunk decodes only when its own
// entry and offsets hold, so every read stays inside its segment, inside the
// body. The error returned is the lowest chunk's among the table, offset and
// length faults (the faults format.py's check_table finds before decoding
// anything), else the lowest chunk's among padding and data faults.
template <class T>
static int64_t decode_impl(const uint8_t* p, int64_t total, int codec, int64_t numel, int64_t C,
                           int64_t nch, int64_t table, int64_t body, int64_t body_nbytes,
                           typename T::W* out, uint8_t* sums, int nthreads, int isa) {
  const uint8_t* offs = p + table + kEntryBytes * nch;
  for (const uint8_t* q = offs + kOffsetBytes * nch; q < p + body; ++q)
    if (*q) return kErrGap;
  const uint8_t* b = p + body;
  // A table, offset or length fault ranks before any padding or data fault.
  constexpr int64_t kDataFault = int64_t(1) << 56;
  std::atomic<int64_t> first_err{INT64_MAX};
#pragma omp parallel for schedule(dynamic, kChunksPerGrab) num_threads(nthreads) if (nch >= kMinParallelChunks)
  for (int64_t c = 0; c < nch; ++c) {
    const int n = chunk_len(numel, C, c);
    Entry en;  // an aligned copy of the entry
    std::memcpy(&en, p + table + kEntryBytes * c, kEntryBytes);
    int64_t tag = 0;
    if (!entry_ok<T>(codec, en, n)) {
      tag = (c << 8) | kErrTable;
    } else {
      Seg s;
      Layout l = segment_layout<T>(codec, en, n, &s);
      uint32_t o[2];
      std::memcpy(o, offs + kOffsetBytes * c, c + 1 < nch ? 8 : 4);
      const int64_t at = int64_t(o[0]) * kAlign;
      const bool lowbyte = T::kF32 && en.mode == kModeCoded && (en.flags & kFlagLowbyte);
      bool bad_bits = false;
      if (lowbyte && at + l.size <= body_nbytes) {
        // The low length is the bitmap's count (read inside the body; the
        // offset checks below then hold only for the true offsets).
        const int64_t n_low = bitmap_count(b + at + l.rem, n, &bad_bits);
        l = segment_layout<T>(codec, en, n, &s, n_low);
      }
      if ((c == 0 && at != 0) || at + l.size > body_nbytes ||
          (c + 1 < nch && int64_t(o[1]) * kAlign != at + l.size)) {
        tag = (c << 8) | kErrOffsets;
      } else if (c + 1 == nch && at + l.size != body_nbytes) {
        tag = (c << 8) | kErrLengths;
      } else {
        const uint8_t* seg = b + at;
        int err;
        if (bad_bits ||
            !(pad_ok(seg, s.codes) && pad_ok(seg + l.sm, s.sm) && pad_ok(seg + l.rem, s.rem) &&
              pad_ok(seg + l.esc, s.esc) && pad_ok(seg + l.low, s.low))) {
          err = kErrPadding;
        } else if (en.mode != kModeCoded) {
          if (en.mode == kModeRaw)
            std::memcpy(out + c * C, seg, size_t(n) * T::kItem);
          else  // ZERO
            std::memset(out + c * C, 0, size_t(n) * T::kItem);
          err = kOk;
        } else {
          DecIn in{seg + l.sm, seg + l.sm + s.sm, BitReader(seg + l.rem, s.rem), seg + l.esc,
                   seg + l.esc + s.esc, p + total};
          in.sm_lim = p + total;
          // The next segment's size is taken as this one's (its entry is not
          // checked yet; a prefetch reads nothing the program sees).
          const bool mine = next_is_mine(c, nch, nthreads);
          const uint8_t* next = mine ? b + int64_t(o[1]) * kAlign : nullptr;
          const int64_t next_nbytes = mine ? l.size : 0;
          if (lowbyte) {
            // The kernels decode the chunk without LOWBYTE from 3-byte groups
            // of low byte 0; then the low bytes are ORed in.
            static thread_local std::vector<uint8_t> groups;
            const int64_t k = n - en.n_zero;
            if (groups.size() < size_t(3 * k + 64)) groups.resize(size_t(3 * k + 64));
#ifdef ZIPCCL_HAVE_AVX2_KERNELS
            if (isa >= 1)
              avx2::lowbyte_hi(seg + l.sm, k, groups.data());
            else
#endif
              lowbyte_hi(seg + l.sm, k, groups.data());
            Entry e3 = en;
            e3.flags &= ~kFlagLowbyte;
            in.sm = groups.data();
            in.sm_end = in.sm + 3 * k;
            in.sm_lim = in.sm + 3 * k + 64;
            in.rem = BitReader(seg + l.rem, 0);
            prefetch_head(seg, in.sm, s.codes, 3 * k);
            err = decode_dispatch<T>(codec, e3, n, seg, in, out + c * C, next, next_nbytes, isa);
            if (!err)
              lowbyte_patch(seg + l.rem, seg + l.low, n, reinterpret_cast<uint32_t*>(out + c * C));
          } else {
            prefetch_head(seg, seg + l.sm, s.codes, s.sm);
            err = decode_dispatch<T>(codec, en, n, seg, in, out + c * C, next, next_nbytes, isa);
          }
        }
        if (err)
          tag = kDataFault | (c << 8) | err;
        else if (sums && C == kChunkElems)
          store_u32(sums + 4 * c, sum_dispatch<T>(out + c * C, n, isa));
      }
    }
    if (tag) {
      int64_t cur = first_err.load();
      while (tag < cur && !first_err.compare_exchange_weak(cur, tag)) {
      }
    }
  }
  const int64_t e = first_err.load();
  if (e != INT64_MAX) return e & (kDataFault - 1);
  if (sums && C != kChunkElems) sums_impl<T>(out, numel, sums, nthreads, isa);
  return 0;
}

// --------------------------------------------------------------------------
// C entry points, called through ctypes (which drops the GIL for the call).
// codec_cpp.py owns every allocation and checks dtype, size and contiguity;
// this file includes no torch or pybind11 header, which keeps the first build
// to a couple of seconds.
// --------------------------------------------------------------------------
template <class F>
static int64_t by_dtype(int64_t dtype_code, F&& f) {
  switch (dtype_code) {
    case BF16::kCode: return f(BF16{});
    case FP16::kCode: return f(FP16{});
    case FP32::kCode: return f(FP32{});
  }
  return -1;
}

static inline bool args_ok(int64_t codec, int64_t nthreads, int64_t isa) {
  return (codec == kFixed3 || codec == kDense) && nthreads >= 1 && isa >= 0 && isa <= best_isa();
}

}  // namespace zipccl

extern "C" {

// The best kernel set this CPU runs: 0 generic, 1 AVX2 + BMI2, 2 AVX-512 VBMI2.
int64_t zipccl_best_isa() { return zipccl::best_isa(); }

// Encode pass 1. Fills entries (nchunks x 16 B), offsets (nchunks int64:
// each segment's byte offset in the body) and body (its size, one int64).
// Returns 0, -1 on bad args.
int64_t zipccl_encode_plan(const void* x, int64_t dtype_code, int64_t codec, int64_t numel,
                           void* entries, int64_t* offsets, int64_t* body, int64_t nthreads,
                           int64_t isa) {
  using namespace zipccl;
  if (!args_ok(codec, nthreads, isa) || numel <= 0) return -1;
  return by_dtype(dtype_code, [&](auto t) -> int64_t {
    using T = decltype(t);
    *body = plan_impl<T>(static_cast<const typename T::W*>(x), numel, int(codec),
                         static_cast<Entry*>(entries), offsets, int(nthreads), int(isa));
    return 0;
  });
}

// Encode pass 2: the table, the offsets and every segment into payload
// (allocated to body_offset + the body pass 1 returned, + the sums), padding
// zeroed from the end of the offsets on, and with sums (not null) the
// checksums there (nchunks x u32). Returns 0, -1 on bad args.
int64_t zipccl_encode_write(const void* x, int64_t dtype_code, int64_t codec, int64_t numel,
                            const void* entries, const int64_t* offsets, void* payload,
                            int64_t table_offset, int64_t body_offset, void* sums,
                            int64_t nthreads, int64_t isa) {
  using namespace zipccl;
  if (!args_ok(codec, nthreads, isa) || numel <= 0) return -1;
  const int64_t nch = (numel + kChunkElems - 1) / kChunkElems;
  if (table_offset % kAlign || body_offset % kAlign ||
      body_offset < table_offset + (kEntryBytes + kOffsetBytes) * nch)
    return -1;
  return by_dtype(dtype_code, [&](auto t) -> int64_t {
    using T = decltype(t);
    write_impl<T>(static_cast<const typename T::W*>(x), numel, int(codec),
                  static_cast<const Entry*>(entries), offsets, static_cast<uint8_t*>(payload),
                  table_offset, body_offset, static_cast<uint8_t*>(sums), int(nthreads),
                  int(isa));
    return 0;
  });
}

// Decode the chunks of a payload whose header was validated in Python
// (format.parse_header). With sums (not null), also the checksums of the
// decoded tensor there (one u32 per kChunkElems; written only when decode
// succeeds). Returns 0, -1 on bad args, or (chunk << 8) | Err of the first
// bad chunk.
int64_t zipccl_decode(const void* payload, int64_t total, void* out, int64_t dtype_code,
                      int64_t codec, int64_t numel, int64_t chunk_elems, int64_t nchunks,
                      int64_t table_offset, int64_t body_offset, int64_t body_nbytes, void* sums,
                      int64_t nthreads, int64_t isa) {
  using namespace zipccl;
  if (!args_ok(codec, nthreads, isa) || chunk_elems < 8 || chunk_elems > 65535 || numel <= 0 ||
      nchunks != (numel + chunk_elems - 1) / chunk_elems || table_offset < 0 ||
      body_offset < table_offset + (kEntryBytes + kOffsetBytes) * nchunks || body_nbytes < 0 ||
      body_offset + body_nbytes > total)
    return -1;
  return by_dtype(dtype_code, [&](auto t) -> int64_t {
    using T = decltype(t);
    return decode_impl<T>(static_cast<const uint8_t*>(payload), total, int(codec), numel,
                          chunk_elems, nchunks, table_offset, body_offset, body_nbytes,
                          static_cast<typename T::W*>(out), static_cast<uint8_t*>(sums),
                          int(nthreads), int(isa));
  });
}

// The checksums of x (numel elements): one u32 per kChunkElems into sums.
// Returns 0, -1 on bad args.
int64_t zipccl_chunk_sums(const void* x, int64_t dtype_code, int64_t numel, void* sums,
                          int64_t nthreads, int64_t isa) {
  using namespace zipccl;
  if (numel < 0 || nthreads < 1 || isa < 0 || isa > best_isa()) return -1;
  return by_dtype(dtype_code, [&](auto t) -> int64_t {
    using T = decltype(t);
    sums_impl<T>(static_cast<const typename T::W*>(x), numel, static_cast<uint8_t*>(sums),
                 int(nthreads), int(isa));
    return 0;
  });
}

// Asks for transparent huge pages on the 2 MiB-aligned interior of a buffer
// that was just allocated and not yet touched: first-touch page faults cost
// about as much as encoding into 4 KiB pages (a hint; errors are ignored).
int64_t zipccl_advise_hugepages(void* p, int64_t nbytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t huge = uintptr_t(2) << 20;
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + huge - 1) & ~(huge - 1);
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + uintptr_t(nbytes)) & ~(huge - 1);
  if (b > a) return madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);
#endif
  (void)p;
  (void)nbytes;
  return 0;
}

// The format constants this file was written for, flattened in the order
// codec_cpp._expected_constants() lists them. Returns how many there are.
int64_t zipccl_constants(int64_t* out, int64_t cap) {
  using namespace zipccl;
  std::vector<int64_t> v = {kChunkElems, kEntryBytes, kOffsetBytes, kAlign, kFixedZeroShift,
                            kDenseZeroShift, kFixedBits, kFixedEsc, kRemBits, kDenseSlots,
                            kZeroSymbol, kNegZeroSymbol, kModeRaw, kModeCoded, kModeZero, kFlagLow16,
                            kFlagZpos, kFlagZneg, kFlagLowbyte, kRaw, kFixed3, kDense};
  for (int b : kTierBits) v.push_back(b);
  for (int s : kTierSymbols) v.push_back(s);
  for (auto& row : kDenseOrder)
    for (int8_t d : row) v.push_back(d);
  for (auto& row : kFixedLo)
    for (int8_t d : row) v.push_back(d);
  for (int64_t k : {int64_t(BF16::kCode), int64_t(FP16::kCode), int64_t(FP32::kCode),
                    int64_t(kSumKeyMul), int64_t(kSumMul1), int64_t(kSumMul2)})
    v.push_back(k);
  const int64_t n = std::min<int64_t>(cap, int64_t(v.size()));
  std::copy(v.begin(), v.begin() + n, out);
  return int64_t(v.size());
}

}  // extern "C"
#endif  // !ZIPCCL_VBMI2_PASS
