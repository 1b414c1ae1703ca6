// Serialisation of RankReport (parallel/wire_codec.h).
#include "parallel/rank_report.h"

#include <stdexcept>
#include <string>

#include "parallel/wire_codec.h"

namespace strata {
namespace {

constexpr uint32_t kReportMagic = 0x54525053;  // "SPRT"

void put_observations(wire::Writer& w, const std::vector<Observation>& observations) {
  w.put<uint32_t>(uint32_t(observations.size()));
  for (const Observation& o : observations) {
    w.put(o.name);
    w.put(o.value);
    w.put(uint8_t(o.kind));
  }
}

std::vector<Observation> get_observations(wire::Reader& in) {
  std::vector<Observation> observations(in.get_count(4 + 8 + 1));
  for (Observation& o : observations) {
    o.name = in.get_string();
    o.value = in.get<int64_t>();
    const uint8_t kind = in.get<uint8_t>();
    if (kind > uint8_t(ObservationKind::verdict)) {
      throw std::runtime_error("rank report: observation '" + o.name + "' of unknown kind " + std::to_string(kind));
    }
    o.kind = ObservationKind(kind);
  }
  return observations;
}

void put_layer(wire::Writer& w, const LayerReport& l) {
  w.put(l.usage);
  w.put(l.evicted_tokens);
  put_observations(w, l.observations);
}

LayerReport get_layer(wire::Reader& in) {
  LayerReport l;
  l.usage = in.get<LayerUsage>();
  l.evicted_tokens = in.get<int64_t>();
  l.observations = get_observations(in);
  return l;
}

void put_detail(wire::Writer& w, const SequenceDetail& d) {
  w.put(d.seq);
  w.put<uint32_t>(uint32_t(d.layers.size()));
  for (const SequenceLayerDetail& l : d.layers) {
    w.put(l.policy);
    w.put(l.appended);
    put_observations(w, l.observations);
  }
}

SequenceDetail get_detail(wire::Reader& in) {
  SequenceDetail d;
  d.seq = in.get<int64_t>();
  const uint32_t n_layers = in.get_count(4 + 4 + 4);
  for (uint32_t i = 0; i < n_layers; ++i) {
    SequenceLayerDetail l;
    l.policy = in.get_string();
    l.appended = in.get<int32_t>();
    l.observations = get_observations(in);
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
  w.put<uint32_t>(uint32_t(r.layers.size()));
  for (const LayerReport& l : r.layers) put_layer(w, l);
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
  const uint32_t n_layers = in.get_count(sizeof(LayerUsage) + 8 + 4);
  for (uint32_t i = 0; i < n_layers; ++i) r.layers.push_back(get_layer(in));
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
