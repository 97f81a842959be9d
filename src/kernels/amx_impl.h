/* AMX helpers shared by the AMX attention body (attention_fast_impl.h) and the AMX GEMM
 * micro-kernel (gemm_vdpbf16.c). Include inside a `#pragma GCC target` region enabling amx-tile
 * and amx-bf16 (the functions are static inline and take that region's target). The caller has
 * checked cdf_k_amx_usable() (the OS permission). */
#ifndef CDF_KERNELS_AMX_IMPL_H
#define CDF_KERNELS_AMX_IMPL_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* Every tile 16 rows x 64 bytes (palette 1: 16 f32, or 32 bf16 = 16 pairs, per row). Loaded
 * by each thread before its first tile instruction, as oneDNN's kernels load their own. */
static inline void amx_config_16x64(void) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
}

/* tmm0-3 += tmm4 x (four B tiles at b, b + 32, b + 64, b + 96 bf16, rows bst bytes apart), with
 * tmm4 loaded from a (rows ast bytes apart): one A tile against 4 column tiles, the B loads
 * rotating through tmm5-7 so a load need not wait for the product reading the one before */
#define AMX_A_X_4B(a, ast, b, bst)                                                                 \
    do {                                                                                           \
        _tile_loadd(4, (a), (ast));                                                                \
        _tile_loadd(5, (b), (bst));                                                                \
        _tile_dpbf16ps(0, 4, 5);                                                                   \
        _tile_loadd(6, (b) + 32, (bst));                                                           \
        _tile_dpbf16ps(1, 4, 6);                                                                   \
        _tile_loadd(7, (b) + 64, (bst));                                                           \
        _tile_dpbf16ps(2, 4, 7);                                                                   \
        _tile_loadd(5, (b) + 96, (bst));                                                           \
        _tile_dpbf16ps(3, 4, 5);                                                                   \
    } while (0)

#endif
