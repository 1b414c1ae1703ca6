// Serialisation of RankReport (parallel/wire_codec.h).
#include "parallel/rank_report.h"

#include "parallel/wire_codec.h"

namespace strata {
namespace {

constexpr uint32_t kReportMagic = 0x54525053;  // "SPRT"

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
  for (const SequenceReport& s : r.sequences) {
    w.put(s.seq);
    w.put(s.entries);
    w.put(s.appended);
    w.put(s.blocks);
    w.put(s.blocks_held);
    w.put(s.lazy);
    w.put(s.capacity);
    w.put(s.merged);
    w.put(s.codebook_keys);
    w.put(s.codebook_values);
    w.put(s.shared_keys);
    w.put<uint32_t>(uint32_t(s.policy.size()));
    for (const std::string& p : s.policy) w.put(p);
  }
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
  const uint32_t n_seqs = in.get_count(8 + 8 + 10 * 4);
  for (uint32_t i = 0; i < n_seqs; ++i) {
    SequenceReport s;
    s.seq = in.get<int64_t>();
    s.entries = in.get_vector<int32_t>();
    s.appended = in.get_vector<int32_t>();
    s.blocks = in.get_vector<int32_t>();
    s.blocks_held = in.get<int64_t>();
    s.lazy = in.get_vector<int8_t>();
    s.capacity = in.get_vector<int32_t>();
    s.merged = in.get_vector<int64_t>();
    s.codebook_keys = in.get_vector<int64_t>();
    s.codebook_values = in.get_vector<int64_t>();
    s.shared_keys = in.get_vector<int64_t>();
    const uint32_t n_policies = in.get_count(4);
    for (uint32_t p = 0; p < n_policies; ++p) s.policy.push_back(in.get_string());
    const size_t n = r.layers.size();
    if (s.entries.size() != n || s.appended.size() != n || s.blocks.size() != n || s.lazy.size() != n ||
        s.capacity.size() != n || s.merged.size() != n || s.codebook_keys.size() != n ||
        s.codebook_values.size() != n || s.shared_keys.size() != n || (!s.policy.empty() && s.policy.size() != n)) {
      throw std::runtime_error("rank report: sequence " + std::to_string(s.seq) + " has per-layer lists of " +
                               std::to_string(s.entries.size()) + " entries for " + std::to_string(n) + " layers");
    }
    r.sequences.push_back(std::move(s));
  }
  r.result = deserialize_step_result(in.get_vector<uint8_t>());
  r.error = in.get_string();
  in.expect_end();
  return r;
}

}  // namespace strata
