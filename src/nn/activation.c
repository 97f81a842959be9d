/* Feed-forward activations by their transformers name (see nn/nn.h). */
#include <string.h>

#include "core/error_internal.h"
#include "nn/nn.h"

cdf_status cdf_act_parse(const char *name, bool allow_quick_gelu, const char *what, const char *listed, cdf_act *out) {
    static const struct {
        const char *name;
        cdf_act act;
    } acts[] = {
        {"quick_gelu", CDF_ACT_QUICK_GELU}, {"gelu", CDF_ACT_GELU}, {"gelu_new", CDF_ACT_GELU_TANH},
        {"gelu_pytorch_tanh", CDF_ACT_GELU_TANH}, {"relu", CDF_ACT_RELU}, {"silu", CDF_ACT_SILU},
        {"swish", CDF_ACT_SILU},
    };
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++)
        if (strcmp(acts[i].name, name) == 0 && (allow_quick_gelu || acts[i].act != CDF_ACT_QUICK_GELU)) {
            *out = acts[i].act;
            return CDF_OK;
        }
    return cdf_error(CDF_ERR_UNSUPPORTED, "config.json: %s '%s' is not supported (%s)", what, name, listed);
}

cdf_tensor *cdf_act_fwd(cdf_act act, cdf_tensor *x) {
    switch (act) {
    case CDF_ACT_QUICK_GELU: return cdf_quick_gelu(x); /* x * sigmoid(1.702 x) */
    case CDF_ACT_GELU: return cdf_gelu(x, CDF_GELU_ERF);
    case CDF_ACT_GELU_TANH: return cdf_gelu(x, CDF_GELU_TANH); /* gelu_new */
    case CDF_ACT_RELU: return cdf_relu(x);
    case CDF_ACT_SILU: return cdf_silu(x);
    }
    return NULL;
}
