// The C entry points of libssmcc_kernels.so (torch_entry.cpp; replay.cpp runs recorded
// sequences of them). Pointers are tensor data; every entry returns 0, or 1 with the reason in
// ssmcc_last_error().
#pragma once

#include <cstdint>

#define SSMCC_EXPORT extern "C" __attribute__((visibility("default")))

SSMCC_EXPORT const char* ssmcc_last_error();

SSMCC_EXPORT int ssmcc_selective_scan_f32(const float* u, const float* delta, const float* A,
                                          const float* B, const float* C, const float* D,
                                          const float* z, const float* delta_bias, const float* h0,
                                          float* out, float* last, int64_t batch, int64_t dim,
                                          int64_t length, int64_t groups_b, int64_t groups_c,
                                          int64_t dstate, int32_t softplus, int32_t threads);

SSMCC_EXPORT int ssmcc_causal_conv1d_f32(const float* x, const float* weight, const float* bias,
                                         const float* state0, float* out, float* final_state,
                                         int64_t batch, int64_t dim, int64_t length, int64_t width,
                                         int32_t activation, int32_t threads);

SSMCC_EXPORT int ssmcc_selective_state_update_f32(const float* state, const float* x,
                                                  const float* dt, const float* A, const float* B,
                                                  const float* C, const float* D, const float* z,
                                                  const float* dt_bias, float* out,
                                                  float* new_state, int64_t batch, int64_t dim,
                                                  int64_t groups_b, int64_t groups_c,
                                                  int64_t dstate, int32_t softplus,
                                                  int32_t threads);

SSMCC_EXPORT int ssmcc_causal_conv1d_update_f32(const float* x, const float* state,
                                                const float* weight, const float* bias, float* out,
                                                float* new_state, int64_t batch, int64_t dim,
                                                int64_t width, int32_t activation, int32_t threads);

SSMCC_EXPORT int ssmcc_ssd_scan_f32(const float* x, const float* dt, const float* A, const float* B,
                                    const float* C, const float* D, const float* z,
                                    const float* dt_bias, const float* h0, float* out, float* last,
                                    int64_t batch, int64_t length, int64_t heads, int64_t head_dim,
                                    int64_t groups, int64_t dstate, int64_t x_stride,
                                    int64_t dt_stride, int64_t b_stride, int64_t c_stride,
                                    int64_t z_stride, int32_t softplus, float dt_min, float dt_max,
                                    int32_t threads);

SSMCC_EXPORT int ssmcc_ssd_mixer_f32(const float* proj, const float* conv_weight,
                                     const float* conv_bias, const float* A, const float* D,
                                     const float* dt_bias, const float* norm_weight,
                                     const float* conv_state, const float* ssm_state, float* y,
                                     float* conv_state_out, float* ssm_state_out, int64_t batch,
                                     int64_t length, int64_t width, int64_t heads, int64_t head_dim,
                                     int64_t groups, int64_t dstate, int64_t kernel,
                                     int64_t z_offset, int64_t xbc_offset, int64_t dt_offset,
                                     int64_t norm_group_size, int32_t activation, int32_t softplus,
                                     int32_t norm_before_gate, float dt_min, float dt_max,
                                     float eps, int32_t threads);

SSMCC_EXPORT int ssmcc_ssd_mixer_step_f32(const float* proj, const float* conv_weight,
                                          const float* conv_bias, const float* A, const float* D,
                                          const float* dt_bias, const float* norm_weight,
                                          const float* conv_state, const float* ssm_state, float* y,
                                          float* conv_state_out, float* ssm_state_out,
                                          int64_t batch, int64_t width, int64_t heads,
                                          int64_t head_dim, int64_t groups, int64_t dstate,
                                          int64_t kernel, int64_t z_offset, int64_t xbc_offset,
                                          int64_t dt_offset, int64_t norm_group_size,
                                          int32_t activation,
                                          int32_t softplus, int32_t norm_before_gate, float dt_min,
                                          float dt_max, float eps, int32_t threads);

SSMCC_EXPORT int ssmcc_ssd_state_update_f32(const float* state, const float* x, const float* dt,
                                            const float* A, const float* B, const float* C,
                                            const float* D, const float* z, const float* dt_bias,
                                            float* out, float* new_state, int64_t batch,
                                            int64_t heads, int64_t head_dim, int64_t groups,
                                            int64_t dstate, int32_t softplus, float dt_min,
                                            float dt_max, int32_t threads);

SSMCC_EXPORT int ssmcc_rmsnorm_gated_f32(const float* x, const float* z, const float* weight,
                                         float* out, int64_t rows, int64_t dim, int64_t group_size,
                                         float eps, int32_t norm_before_gate, int32_t threads);

SSMCC_EXPORT int ssmcc_linear_f32(const float* x, const float* weight, const float* bias, float* y,
                                  int64_t rows, int64_t out_features, int64_t in_features,
                                  int32_t threads);

SSMCC_EXPORT int ssmcc_add_f32(const float* a, const float* b, float* out, int64_t n);

SSMCC_EXPORT int ssmcc_quantized_linear(const float* x, const void* weight, int32_t storage,
                                        const float* scale, const float* bias, float* y,
                                        int64_t rows, int64_t out_features, int64_t in_features,
                                        int64_t groups, int32_t threads);

SSMCC_EXPORT int ssmcc_dequantize(const void* weight, int32_t storage, const float* scale,
                                  float* out, int64_t out_features, int64_t in_features,
                                  int64_t groups, int32_t threads);

// The experts of a MoE layer for a few tokens; up / down as a mixer's weights (mixer_weight.h).
SSMCC_EXPORT int ssmcc_moe_experts(const float* hidden, const int64_t* index, const float* weights,
                                   const void* up, int32_t up_storage, const float* up_scale,
                                   int64_t up_groups, const void* down, int32_t down_storage,
                                   const float* down_scale, int64_t down_groups, float* out,
                                   int64_t tokens, int64_t k, int64_t experts, int64_t d,
                                   int64_t width, int32_t gated, int32_t activation,
                                   int32_t threads);

// x_proj / dt_proj: float32 (storage -1, scale null) or stored small (mixer_weight.h).
SSMCC_EXPORT int ssmcc_mamba_mixer_f32(
    const float* proj, const float* conv_weight, const float* conv_bias, const void* x_proj,
    const void* dt_proj, const float* A, const float* D, const float* dt_bias,
    const float* conv_state, const float* ssm_state, float* y, float* conv_state_out,
    float* ssm_state_out, int64_t batch, int64_t length, int64_t width, int64_t x_offset,
    int64_t z_offset, int64_t channels, int64_t kernel, int64_t rank, int64_t dstate,
    int32_t activation, int32_t softplus, int32_t rms, float rms_eps, const float* x_proj_scale,
    int32_t x_proj_storage, int64_t x_proj_groups, const float* dt_proj_scale,
    int32_t dt_proj_storage, int64_t dt_proj_groups, int32_t threads);

SSMCC_EXPORT int ssmcc_mamba_mixer_step_f32(
    const float* proj, const float* conv_weight, const float* conv_bias, const void* x_proj,
    const void* dt_proj, const float* A, const float* D, const float* dt_bias,
    const float* conv_state, const float* ssm_state, float* y, float* conv_state_out,
    float* ssm_state_out, int64_t batch, int64_t width, int64_t x_offset, int64_t z_offset,
    int64_t channels, int64_t kernel, int64_t rank, int64_t dstate, int32_t activation,
    int32_t softplus, int32_t rms, float rms_eps, const float* x_proj_scale,
    int32_t x_proj_storage, int64_t x_proj_groups, const float* dt_proj_scale,
    int32_t dt_proj_storage, int64_t dt_proj_groups, int32_t threads);
