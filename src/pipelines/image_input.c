/* Input images for img2img / inpainting, as diffusers' VaeImageProcessor.preprocess prepares a
 * PIL image: resize to (width, height) with PIL's Lanczos filter (Pillow's 8-bit fixed-point
 * two-pass resampler, reproduced operation by operation so the bytes match), then
 *   image: convert("RGB"), / 255 (float32), 2x - 1           -> [1, 3, H, W]
 *   mask:  convert("L") (after the resize, as diffusers), / 255, binarised at 0.5 -> [H, W] of 0/1
 * The pixels come from the caller (the CLI reads PNG files); channel counts other than the ones
 * accepted here would need PIL's mode conversions (alpha premultiplication in resize, palette)
 * and are refused instead of silently treated differently. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"

#define PRECISION_BITS (32 - 8 - 2) /* Pillow's Resample.c */

static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= M_PI;
    return sin(x) / x;
}

static double lanczos(double x) { return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0; }

/* Pillow precompute_coeffs + normalize_coeffs_8bpc for one axis: out_size rows of ksize
 * fixed-point weights starting at bounds[2i] over bounds[2i+1] input pixels. */
static int precompute(int in_size, int out_size, int **bounds_out, int32_t **kk_out) {
    double scale = (double)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 3.0 * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    double *kk = calloc((size_t)out_size * ksize, sizeof *kk);
    int *bounds = malloc((size_t)out_size * 2 * sizeof *bounds);
    int32_t *ik = malloc((size_t)out_size * ksize * sizeof *ik);
    if (!kk || !bounds || !ik) {
        free(kk);
        free(bounds);
        free(ik);
        return 0;
    }
    for (int xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double *k = kk + (size_t)xx * ksize;
        for (int x = 0; x < xmax; x++) {
            double w = lanczos((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (int x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        bounds[xx * 2] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    for (size_t i = 0; i < (size_t)out_size * ksize; i++)
        ik[i] = kk[i] < 0 ? (int32_t)(-0.5 + kk[i] * (1 << PRECISION_BITS)) : (int32_t)(0.5 + kk[i] * (1 << PRECISION_BITS));
    free(kk);
    *bounds_out = bounds;
    *kk_out = ik;
    return ksize;
}

static uint8_t clip8(int64_t v) {
    if (v >= ((int64_t)1 << PRECISION_BITS << 8)) return 255;
    if (v <= 0) return 0;
    return (uint8_t)(v >> PRECISION_BITS);
}

/* One Lanczos pass of Pillow's resampler along one axis of an 8-bit image with c interleaved
 * channels: `lines` lines of `n_in` pixels (stride `step` pixels between neighbours along the
 * axis, `line_step` between lines) become lines of `n_out` pixels in `out` (same layout with the
 * output sizes). */
static void pass(const uint8_t *in, uint8_t *out, int lines, int n_in, int n_out, size_t in_step, size_t in_line,
                 size_t out_step, size_t out_line, int c, const int *bounds, const int32_t *kk, int ksize) {
    (void)n_in;
    for (int l = 0; l < lines; l++)
        for (int o = 0; o < n_out; o++) {
            const int32_t *k = kk + (size_t)o * ksize;
            int xmin = bounds[o * 2], xmax = bounds[o * 2 + 1];
            for (int ch = 0; ch < c; ch++) {
                int64_t ss = 1 << (PRECISION_BITS - 1);
                for (int x = 0; x < xmax; x++) ss += (int64_t)in[(size_t)l * in_line + (size_t)(x + xmin) * in_step + ch] * k[x];
                out[(size_t)l * out_line + (size_t)o * out_step + ch] = clip8(ss);
            }
        }
}

/* Image.resize((ow, oh), LANCZOS) of an 8-bit image with c interleaved channels, as Pillow 13
 * does it: two separable passes, each skipped when that side keeps its size; the vertical pass
 * first when the height shrinks by more than twice what the width shrinks (Pillow's speed rule,
 * which changes the rounding of the intermediate image, so it matters for the bytes). */
static cdf_status pil_resize(const uint8_t *in, int iw, int ih, int c, int ow, int oh, uint8_t **out) {
    *out = NULL;
    const bool vertical_first = (ih - oh) > 0 && (ih - oh) > (iw - ow) * 2;
    const int tw = vertical_first ? iw : ow, th = vertical_first ? oh : ih; /* the intermediate image */
    uint8_t *tmp = malloc((size_t)tw * th * c), *res = malloc((size_t)ow * oh * c);
    int *bh = NULL, *bv = NULL;
    int32_t *kh = NULL, *kv = NULL;
    int ksh = ow != iw ? precompute(iw, ow, &bh, &kh) : -1, ksv = oh != ih ? precompute(ih, oh, &bv, &kv) : -1;
    if (!tmp || !res || ksh == 0 || ksv == 0) {
        free(tmp);
        free(res);
        free(bh), free(kh), free(bv), free(kv);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory resizing the input image");
    }
    /* horizontal: lines are rows; vertical: lines are columns */
#define HPASS(src, dst, rows, w_in) \
    pass(src, dst, rows, w_in, ow, c, (size_t)(w_in) * c, c, (size_t)ow * c, c, bh, kh, ksh)
#define VPASS(src, dst, w) pass(src, dst, w, ih, oh, (size_t)(w) * c, c, (size_t)(w) * c, c, c, bv, kv, ksv)
    const uint8_t *cur = in;
    if (vertical_first) {
        if (ksv > 0) VPASS(in, tmp, iw);
        else memcpy(tmp, in, (size_t)tw * th * c);
        if (ksh > 0) HPASS(tmp, res, oh, iw);
        else memcpy(res, tmp, (size_t)ow * oh * c);
    } else {
        if (ksh > 0) HPASS(cur, tmp, ih, iw);
        else memcpy(tmp, cur, (size_t)tw * th * c);
        if (ksv > 0) VPASS(tmp, res, ow);
        else memcpy(res, tmp, (size_t)ow * oh * c);
    }
#undef HPASS
#undef VPASS
    free(tmp);
    free(bh), free(kh), free(bv), free(kv);
    *out = res;
    return CDF_OK;
}

static cdf_status check_image(const cdf_image *img, const char *what) {
    if (!img->pixels || img->width <= 0 || img->height <= 0)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: no pixels (%dx%d)", what, img->width, img->height);
    return CDF_OK;
}

/* Flux2Pipeline's reference image size: scaled to at most 1024x1024 pixels of area
 * (Flux2ImageProcessor._resize_to_target_area: int(side * sqrt(area / (w * h)))), then the
 * multiple of 16 the center crop keeps. */
static void reference_sizes(const cdf_image *img, int *rw, int *rh, int *w, int *h) {
    *rw = img->width;
    *rh = img->height;
    if ((int64_t)img->width * img->height > 1024 * 1024) {
        double scale = sqrt((double)(1024 * 1024) / ((double)img->width * img->height));
        *rw = (int)(img->width * scale);
        *rh = (int)(img->height * scale);
    }
    *w = *rw / 16 * 16;
    *h = *rh / 16 * 16;
}

void cdf_pipe_reference_size(const cdf_image *img, int *w, int *h) {
    int rw, rh;
    reference_sizes(img, &rw, &rh, w, h);
}

/* Flux2ImageProcessor.check_image_input, and what the pipeline can take. */
static cdf_status check_references(const cdf_generate_params *gp, int n) {
    if (n > CDF_FLUX2_MAX_REFERENCE_IMAGES)
        return cdf_error(CDF_ERR_INVALID_ARG, "%d reference images given; FLUX.2 takes at most %d", n, CDF_FLUX2_MAX_REFERENCE_IMAGES);
    if (gp->mask_image) return cdf_error(CDF_ERR_INVALID_ARG, "FLUX.2 takes reference images, not a mask (no inpainting pipeline)");
    for (int i = 0; i < n; i++) {
        const cdf_image *im = &gp->image[i];
        char what[48];
        snprintf(what, sizeof what, "reference image %d", i + 1);
        CDF_TRY(check_image(im, what));
        if (im->channels != 3)
            return cdf_error(CDF_ERR_INVALID_ARG, "%s: %d channel(s); FLUX.2 needs RGB images (3 channels, no alpha)", what, im->channels);
        if (im->width < 64 || im->height < 64)
            return cdf_error(CDF_ERR_INVALID_ARG, "%s is %dx%d: both sides must be at least 64 pixels", what, im->width, im->height);
        double ar = im->width > im->height ? (double)im->width / im->height : (double)im->height / im->width;
        if (ar > 8.0) return cdf_error(CDF_ERR_INVALID_ARG, "%s is %dx%d: aspect ratio %.1f:1 exceeds 8:1", what, im->width, im->height, ar);
    }
    return CDF_OK;
}

cdf_status cdf_pipe_check_inputs(const cdf_generate_params *gp, bool references) {
    if (!gp->image) {
        if (gp->mask_image) return cdf_error(CDF_ERR_INVALID_ARG, "a mask needs an image to inpaint (--image)");
        if (gp->num_input_images > 0) return cdf_error(CDF_ERR_INVALID_ARG, "num_input_images %d but no image", gp->num_input_images);
        return CDF_OK;
    }
    const int n = gp->num_input_images > 0 ? gp->num_input_images : 1;
    if (gp->num_input_images < 0) return cdf_error(CDF_ERR_INVALID_ARG, "num_input_images %d is negative", gp->num_input_images);
    if (references) return check_references(gp, n);
    if (n > 1) return cdf_error(CDF_ERR_INVALID_ARG, "%d input images given; img2img and inpainting take one (FLUX.2 takes several)", n);
    CDF_TRY(check_image(gp->image, "image"));
    if (gp->image->channels != 3)
        return cdf_error(CDF_ERR_INVALID_ARG, "image: %d channel(s); img2img needs an RGB image (3 channels, no alpha)",
                         gp->image->channels);
    if (!(gp->strength > 0.0 && gp->strength <= 1.0))
        return cdf_error(CDF_ERR_INVALID_ARG, "strength must be in (0, 1] (got %g)", gp->strength);
    if (gp->mask_image) {
        const cdf_image *m = gp->mask_image;
        CDF_TRY(check_image(m, "mask"));
        if (m->channels != 1 && m->channels != 3)
            return cdf_error(CDF_ERR_INVALID_ARG, "mask: %d channels; a mask must be grayscale (1 channel) or RGB (3)", m->channels);
        if (m->width != gp->image->width || m->height != gp->image->height)
            return cdf_error(CDF_ERR_INVALID_ARG, "mask is %dx%d but the image is %dx%d: they must be the same size", m->width,
                             m->height, gp->image->width, gp->image->height);
    }
    return CDF_OK;
}

/* RGB pixels (row stride pw) -> [3, h, w] floats in [-1, 1] from the w x h window at (left, top):
 * / 255 in float32 as numpy, then 2x - 1 as torch. Takes px (freed). */
static cdf_status to_chw(uint8_t *px, int pw, int left, int top, int w, int h, float **chw) {
    float *o = malloc((size_t)3 * w * h * sizeof *o);
    if (!o) {
        free(px);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (input image)");
    }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++) {
                float v = (float)px[((size_t)(y + top) * pw + x + left) * 3 + c] / 255.0f;
                o[(size_t)c * w * h + (size_t)y * w + x] = 2.0f * v - 1.0f;
            }
    free(px);
    *chw = o;
    return CDF_OK;
}

cdf_status cdf_pipe_preprocess_image(const cdf_image *img, int W, int H, float **chw) {
    *chw = NULL;
    uint8_t *px = NULL;
    CDF_TRY(pil_resize(img->pixels, img->width, img->height, 3, W, H, &px));
    return to_chw(px, W, 0, 0, W, H, chw);
}

cdf_status cdf_pipe_preprocess_mask(const cdf_image *m, int W, int H, float **hw) {
    *hw = NULL;
    uint8_t *px = NULL;
    CDF_TRY(pil_resize(m->pixels, m->width, m->height, m->channels, W, H, &px));
    float *o = malloc((size_t)W * H * sizeof *o);
    if (!o) {
        free(px);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (mask)");
    }
    for (size_t i = 0; i < (size_t)W * H; i++) {
        uint32_t l = px[i * m->channels];
        if (m->channels == 3) /* Pillow's convert("L"): ITU-R 601-2 luma in 16-bit fixed point */
            l = ((uint32_t)px[i * 3] * 19595 + (uint32_t)px[i * 3 + 1] * 38470 + (uint32_t)px[i * 3 + 2] * 7471 + 0x8000) >> 16;
        o[i] = ((float)l / 255.0f) < 0.5f ? 0.0f : 1.0f;
    }
    free(px);
    *hw = o;
    return CDF_OK;
}

cdf_status cdf_pipe_preprocess_reference(const cdf_image *img, float **chw, int *W, int *H) {
    *chw = NULL;
    int rw, rh, w, h;
    reference_sizes(img, &rw, &rh, &w, &h);
    uint8_t *px = NULL;
    CDF_TRY(pil_resize(img->pixels, img->width, img->height, 3, rw, rh, &px));
    *W = w;
    *H = h;
    /* Flux2ImageProcessor._resize_and_crop: a center crop, no resampling */
    return to_chw(px, rw, (rw - w) / 2, (rh - h) / 2, w, h, chw);
}
