#pragma once
// KVzip's attention statistic (Kim et al., 2025): for the entries [0, sinks) and [from, n) of a layer (the sinks
// and the newest chunk of a chunked prefill), the largest probability that any of the rows asked for gives them,
// each row's probabilities renormalized over those entries first (kvpress's KVzipPress scores the chunk so). Asked
// for by a policy (PolicyNeeds::prefill_row_maxima), computed by the attention (AttentionSequence::column_maxima).

namespace strata {

struct ColumnMaxima {
  int sinks = 0;
  int from = 0;
};

}  // namespace strata
