// The AVX-512 BW/VL/VBMI2 build of codec.cpp's block kernels, in a
// translation unit of its own (see the top of codec.cpp): codec.cpp's
// dispatch calls them as vbmi2::* after its run-time CPU check. Without a
// compiler that knows the target, or with -DZIPCCL_NO_VBMI2, this unit has
// no kernels and codec.cpp no VBMI2 kernel set.
#define ZIPCCL_VBMI2_PASS 1
#include "codec.cpp"  // NOLINT(build/include): one text, two builds
