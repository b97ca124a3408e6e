// Tuning constants of the ssmcc CPU kernels, in one place (both bindings include this header, and
// the build's cache key hashes it: changing a value rebuilds the libraries).
#pragma once

#include <cstdint>

namespace ssmcc::tuning {

// selective_state_update: rows go in blocks of this many; the per-row transcendentals (softplus
// of dt, the silu gate) run in loops over a block, which vectorise, then the state loop per row.
constexpr int64_t kStepBlock = 64;

// torch binding (OpenMP): below this many inner-loop iterations a call runs on the calling
// thread; waking an OpenMP team costs more than it saves at decode sizes (and torch's own OpenMP
// threads may still be spinning).
constexpr int64_t kParallelWork = int64_t(1) << 18;

// ONNX Runtime binding: rows per task handed to ORT's intra-op thread pool (light rows; a row of
// a scan is a whole sequence of one head and goes alone, so that 24 heads split evenly).
constexpr int64_t kRowsPerTask = 8;

// ssd_scan (ssd_chunked.h): positions per chunk of the block decomposition, and the length from
// which it runs chunked (below, the sequential recurrence of ssd_kernels.h).
constexpr int64_t kSsdChunk = 64;
constexpr int64_t kSsdChunkedFrom = 16;

// the fused mixers (ssd_mixer.h, mamba_mixer.h): positions per task of their channels-last conv
// and of the Mamba-1 mixer's projections; the projections' depth block (x_proj's rows per pass
// stay in cache while a block of positions is multiplied).
constexpr int64_t kMixerConvBlock = 64;
constexpr int64_t kProjectionDepth = 256;
// mamba_mixer's scan: blocks of vector-width channels per task (their states stay in L1).
constexpr int64_t kScanGroup = 8;

}  // namespace ssmcc::tuning
