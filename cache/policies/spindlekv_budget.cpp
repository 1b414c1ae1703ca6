#include "cache/policies/spindlekv_budget.h"

#include <algorithm>
#include <cmath>

namespace strata {

std::optional<int> spindle_context_keep(int layer, int n_layers, int prompt_len, const SpindleBudget& b) {
  const int l = prompt_len, context = prompt_len - b.window;
  if (context <= 0) return std::nullopt;
  const double rc = (b.ratio * l - b.window) / context;
  if (rc >= 1.0) return std::nullopt;
  if (rc <= 0.0) return 0;
  const double alpha = (1.0 + b.beta) / 2.0;
  double top = rc, bottom = rc;  // layer 0, layer m - 1
  if (rc <= b.beta) {
    top = bottom = b.beta;
  } else if (rc <= alpha) {
    top = 2.0 * rc - b.beta;
    bottom = b.beta;
  } else {
    top = 1.0;
    bottom = b.printed_top ? std::max(0.0, 1.0 - 2.0 * rc) : 2.0 * rc - 1.0;
  }
  const double ratio = n_layers > 1 ? top + (bottom - top) * double(layer) / double(n_layers - 1) : (top + bottom) / 2;
  // The small slack keeps a product that is an integer in exact arithmetic from flooring one below it.
  const int k = std::clamp(int(std::floor(ratio * context + 1e-9)), 0, context);
  if (k == context) return std::nullopt;
  return k;
}

}  // namespace strata
