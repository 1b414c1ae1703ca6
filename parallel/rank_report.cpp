// Serialisation of RankReport (parallel/wire_codec.h).
#include "parallel/rank_report.h"

#include "parallel/wire_codec.h"

namespace strata {
namespace {

constexpr uint32_t kReportMagic = 0x54525053;  // "SPRT"

void put_detail(wire::Writer& w, const SequenceDetail& d) {
  w.put(d.seq);
  w.put<uint32_t>(uint32_t(d.layers.size()));
  for (const SequenceLayerDetail& l : d.layers) {
    w.put(l.policy);
    w.put(l.appended);
    w.put(l.lazy);
    w.put(l.capacity);
    w.put(l.merged_tokens);
    w.put(l.codebook_keys);
    w.put(l.codebook_values);
    w.put(l.shared_keys);
  }
}

SequenceDetail get_detail(wire::Reader& in) {
  SequenceDetail d;
  d.seq = in.get<int64_t>();
  const uint32_t n_layers = in.get_count(4 + 4 + 1 + 4 + 4 * 8);
  for (uint32_t i = 0; i < n_layers; ++i) {
    SequenceLayerDetail l;
    l.policy = in.get_string();
    l.appended = in.get<int32_t>();
    l.lazy = in.get<int8_t>();
    l.capacity = in.get<int32_t>();
    l.merged_tokens = in.get<int64_t>();
    l.codebook_keys = in.get<int64_t>();
    l.codebook_values = in.get<int64_t>();
    l.shared_keys = in.get<int64_t>();
    d.layers.push_back(std::move(l));
  }
  return d;
}

// Every per-layer list of a sequence has one item per layer of the shard.
void check_layer_count(int64_t seq, size_t n, size_t n_layers) {
  if (n != n_layers) {
    throw std::runtime_error("rank report: sequence " + std::to_string(seq) + " has per-layer lists of " +
                             std::to_string(n) + " entries for " + std::to_string(n_layers) + " layers");
  }
}

}  // namespace

std::vector<uint8_t> serialize(const RankReport& r) {
  wire::Writer w;
  w.put(kReportMagic);
  w.put(r.step);
  w.put(r.world_rank);
  w.put(r.pp_stage);
  w.put(r.tp_rank);
  w.put(r.layer_begin);
  w.put(r.block_size);
  w.put(r.block_bytes);
  w.put(r.blocks_free);
  w.put(r.blocks_total);
  w.put(r.layers);  // LayerReport is trivially copyable
  w.put<uint32_t>(uint32_t(r.sequences.size()));
  for (const SequenceKv& s : r.sequences) {
    w.put(s.seq);
    w.put(s.entries);
    w.put(s.blocks);
    w.put(s.blocks_held);
  }
  w.put<uint32_t>(uint32_t(r.details.size()));
  for (const SequenceDetail& d : r.details) put_detail(w, d);
  w.put(serialize(r.result));
  w.put(r.error);
  return w.take();
}

RankReport deserialize_rank_report(const std::vector<uint8_t>& bytes) {
  wire::Reader in(bytes, "rank report");
  in.expect(kReportMagic, "a rank report");
  RankReport r;
  r.step = in.get<uint64_t>();
  r.world_rank = in.get<int32_t>();
  r.pp_stage = in.get<int32_t>();
  r.tp_rank = in.get<int32_t>();
  r.layer_begin = in.get<int32_t>();
  r.block_size = in.get<int32_t>();
  r.block_bytes = in.get<int64_t>();
  r.blocks_free = in.get<int64_t>();
  r.blocks_total = in.get<int64_t>();
  r.layers = in.get_vector<LayerReport>();
  const uint32_t n_seqs = in.get_count(8 + 4 + 4 + 8);
  for (uint32_t i = 0; i < n_seqs; ++i) {
    SequenceKv s;
    s.seq = in.get<int64_t>();
    s.entries = in.get_vector<int32_t>();
    s.blocks = in.get_vector<int32_t>();
    s.blocks_held = in.get<int64_t>();
    check_layer_count(s.seq, s.entries.size(), r.layers.size());
    check_layer_count(s.seq, s.blocks.size(), r.layers.size());
    r.sequences.push_back(std::move(s));
  }
  const uint32_t n_details = in.get_count(8 + 4);
  for (uint32_t i = 0; i < n_details; ++i) {
    r.details.push_back(get_detail(in));
    check_layer_count(r.details.back().seq, r.details.back().layers.size(), r.layers.size());
  }
  r.result = deserialize_step_result(in.get_vector<uint8_t>());
  r.error = in.get_string();
  in.expect_end();
  return r;
}

}  // namespace strata
