"""The extra host/device memory a compressed collective allocates, beyond its output.

A raw collective writes into the caller's output; a compressed one also holds
payloads, a send and a receive buffer of payload bytes, and the codec's own
temporaries, all freed when the call returns. For an unpipelined call with a
memory-speed backend (cpp; the Triton kernels allocate the same buffers on the
GPU), with S the bytes of the call's input, r the compressed ratio (about 0.66
for bf16 model data, 0.35 for fp32 exact bf16 casts) and w the world size:

* all-gather: the own payload (r S), its copy padded to the largest payload
  (r S), the receive buffer (w r S); gloo adds a staging copy of the receive
  buffer (w r S), as it does for a raw all-gather (w S). Peak extra
  ``(2 + 2 w) r S``.
* reduce-scatter: the w - 1 payloads and their concatenation (2 (w-1)/w r S),
  the received payloads ((w-1)/w r S), one decoded chunk (S / w) and, unless
  the output is fp32, an fp32 accumulator. About the same as zipccl's raw
  reduce-scatter (an all-to-all of S plus the local sum), which gloo needs
  because it has no PREMUL_SUM.
* all-reduce: the reduce-scatter above, then the all-gather above on a chunk
  of S / w.
* all-to-all: payloads, their concatenation and the receive buffer,
  ``3 (w-1)/w r S``; torch's raw all-to-all allocates nothing.
* verify adds the checksum pass (int64 temporaries of 32 chunks, 1 MiB, on
  the CPU) and one copy of each payload (``encode`` appends the sums by
  concatenation).

Measured (``benchmarks/collective_memory.py``, 16 MiB input per rank, 2 gloo
ranks, peak RSS growth during one call, as a multiple of the input bytes S;
bf16 except fp32 bf16-casts for reduce-scatter)::

    collective      raw    cpp    cpp+verify  cpp 4 pieces  torch backend
    all_gather      2.00   4.00   4.00        1.66          78.3
    reduce_scatter  1.00   1.00   1.12-1.24   0.62          20.4
    all_reduce      3.00   3.50   3.50        2.25          39.8
    all_to_all      0.00   1.00   1.00        0.49          38.5

So with the cpp backend a compressed call needs at most about 2 S more than
the raw one (all-gather: 4 S against 2 S), and verify adds at most 0.25 S.
The torch backend, the format's vectorized reference, materializes int64
temporaries per element over the whole tensor and peaks at 20-80 S: it is
the fallback when the C++ build fails (``backend="auto"``), and on a large
FSDP2 shard that peak, not the payload, decides whether a step fits in memory.
Pipelined calls (``ZipCCLConfig(pipeline_pieces=4)``, ``pipeline.py``) hold
about one piece's buffers at a time and peak below the raw path for the
all-gather, the reduce-scatter and the all-reduce (the all-to-all still holds
0.5 S that torch's raw one does not).
"""
__all__: list = []

