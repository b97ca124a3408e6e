// Replays a recorded sequence of kernel calls in one C call (lowering/torch/replay.py records it).
//
// A decoded token runs ~100 small kernel calls (mamba-130m: 49 matrix-vector products, 24 fused
// mixer steps, 25 norms, 24 residual adds); called one by one from Python each costs ~10 us of
// argument handling, ~2 ms per token beside ~12 ms of weight reading. Recorded once, they run
// here back to back.
//
// Code, one instruction after another, every word an int64:
//   entry, nargs, nrelocs, args[nargs], (arg, slot, offset)[nrelocs]
// ``entry`` indexes kEntries (ssmcc_replay_entry looks a name up); each arg holds the call's
// value: a pointer or integer as it is, a float as its 32 bits. A relocation replaces args[arg]
// by slots[slot] + offset: the address of this call's input or output tensor plus a byte offset.
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "torch_entry.h"

namespace {

constexpr int64_t kMaxArgs = 64;

struct Arg {
  int64_t bits;

  template <typename T>
  T as() const {
    if constexpr (std::is_pointer_v<T>) {
      return reinterpret_cast<T>(bits);
    } else if constexpr (std::is_same_v<T, float>) {
      const auto low = static_cast<uint32_t>(bits);
      float value;
      std::memcpy(&value, &low, sizeof value);
      return value;
    } else {
      return static_cast<T>(bits);
    }
  }
};

template <typename Fn>
struct Signature;

template <typename... Params>
struct Signature<int (*)(Params...)> {
  static constexpr int arity = sizeof...(Params);

  template <auto Fn, size_t... I>
  static int call(const Arg* args, std::index_sequence<I...>) {
    return Fn(args[I].template as<Params>()...);
  }
};

template <auto Fn>
int call(const Arg* args) {
  using S = Signature<decltype(Fn)>;
  return S::template call<Fn>(args, std::make_index_sequence<S::arity>{});
}

struct Entry {
  const char* name;
  int arity;
  int (*run)(const Arg*);
};

#define SSMCC_ENTRY(fn) {#fn, Signature<decltype(&fn)>::arity, &call<&fn>}

const Entry kEntries[] = {
    SSMCC_ENTRY(ssmcc_selective_scan_f32),       SSMCC_ENTRY(ssmcc_causal_conv1d_f32),
    SSMCC_ENTRY(ssmcc_selective_state_update_f32), SSMCC_ENTRY(ssmcc_causal_conv1d_update_f32),
    SSMCC_ENTRY(ssmcc_ssd_scan_f32),             SSMCC_ENTRY(ssmcc_ssd_mixer_f32),
    SSMCC_ENTRY(ssmcc_ssd_mixer_step_f32),       SSMCC_ENTRY(ssmcc_ssd_state_update_f32),
    SSMCC_ENTRY(ssmcc_rmsnorm_gated_f32),        SSMCC_ENTRY(ssmcc_add_f32),
    SSMCC_ENTRY(ssmcc_linear_f32),               SSMCC_ENTRY(ssmcc_quantized_linear),
    SSMCC_ENTRY(ssmcc_dequantize),               SSMCC_ENTRY(ssmcc_mamba_mixer_f32),
    SSMCC_ENTRY(ssmcc_mamba_mixer_step_f32),
};

#undef SSMCC_ENTRY

constexpr int64_t kEntryCount = sizeof(kEntries) / sizeof(kEntries[0]);

}  // namespace

// Index of the entry ``name`` (its parameter count in ``arity``), or -1 if it cannot be replayed.
SSMCC_EXPORT int32_t ssmcc_replay_entry(const char* name, int32_t* arity) {
  for (int64_t i = 0; i < kEntryCount; ++i) {
    if (std::strcmp(kEntries[i].name, name) == 0) {
      *arity = kEntries[i].arity;
      return static_cast<int32_t>(i);
    }
  }
  return -1;
}

// Runs ``code`` (``length`` words) with ``slots`` (``slot_count`` addresses): 0, an entry's 1
// (its reason in ssmcc_last_error(), the instructions after it not run), or -1 for malformed
// code (checked as it runs: instructions before the malformed one have run).
SSMCC_EXPORT int ssmcc_replay(const int64_t* code, int64_t length, const int64_t* slots,
                              int64_t slot_count) {
  Arg args[kMaxArgs];
  int64_t at = 0;
  while (at < length) {
    if (length - at < 3) return -1;
    const int64_t entry = code[at], nargs = code[at + 1], nrelocs = code[at + 2];
    at += 3;
    if (entry < 0 || entry >= kEntryCount || nargs != kEntries[entry].arity || nrelocs < 0 ||
        length - at < nargs + 3 * nrelocs)
      return -1;
    for (int64_t i = 0; i < nargs; ++i) args[i].bits = code[at + i];
    at += nargs;
    for (int64_t r = 0; r < nrelocs; ++r, at += 3) {
      const int64_t arg = code[at], slot = code[at + 1];
      if (arg < 0 || arg >= nargs || slot < 0 || slot >= slot_count) return -1;
      args[arg].bits = slots[slot] + code[at + 2];
    }
    const int status = kEntries[entry].run(args);
    if (status != 0) return status;
  }
  return 0;
}
