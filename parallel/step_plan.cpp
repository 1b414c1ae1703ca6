// Serialisation of StepPlan and StepResult (parallel/wire_codec.h).
#include "parallel/step_plan.h"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>

#include "kernels/token_mask_layout.h"
#include "parallel/wire_codec.h"

namespace strata {
namespace {

using wire::Reader;
using wire::Writer;

constexpr uint32_t kPlanMagic = 0x4e4c5053;    // "SPLN"
constexpr uint32_t kResultMagic = 0x53455253;  // "SRES"

void put_sampling(Writer& w, const SamplingRule& s) {
  w.put(s.temperature);
  w.put(s.top_p);
  w.put<int32_t>(s.top_k);
  w.put(s.min_p);
  w.put(s.presence_penalty);
  w.put(s.frequency_penalty);
  w.put<int32_t>(s.n_logprobs);
  w.put(s.logit_bias);
}

SamplingRule get_sampling(Reader& r) {
  SamplingRule s;
  s.temperature = r.get<float>();
  s.top_p = r.get<float>();
  s.top_k = r.get<int32_t>();
  s.min_p = r.get<float>();
  s.presence_penalty = r.get<float>();
  s.frequency_penalty = r.get<float>();
  s.n_logprobs = r.get<int32_t>();
  s.logit_bias = r.get_vector<TokenPenalty>();
  return s;
}

void put_policy(Writer& w, const std::optional<PolicySpec>& spec) {
  w.put<uint8_t>(spec.has_value());
  if (!spec) return;
  w.put(spec->name);
  w.put<uint32_t>(uint32_t(spec->params.size()));
  for (const auto& [key, value] : spec->params) {
    w.put(key);
    w.put(value);
  }
}

std::optional<PolicySpec> get_policy(Reader& r) {
  if (r.get<uint8_t>() == 0) return std::nullopt;
  PolicySpec spec;
  spec.name = r.get_string();
  const uint32_t n_params = r.get_count(8);
  for (uint32_t i = 0; i < n_params; ++i) {
    std::string key = r.get_string();
    // A repeated key would silently drop a value (found by tests/fuzz/step_plan_fuzz.cpp): not a message the
    // leader writes.
    if (spec.params.count(key) != 0) throw std::runtime_error("step message: policy parameter '" + key + "' repeated");
    spec.params[std::move(key)] = r.get_string();
  }
  return spec;
}

// A token mask travels in the shortest of three forms (docs/decisions.md [structured-output]): the bitset, the
// allowed ids (a structural point of a JSON document allows a handful), or the refused ids (inside a free string
// nearly everything is allowed). The list forms carry the bitset's word count.
enum class MaskForm : uint8_t { none, bits, allowed, refused };
constexpr uint32_t kMaxMaskWords = 1u << 16;  // 4 Mi tokens: beyond any vocabulary

// The form put_mask writes: the list of the rarer kind of bit when it is shorter than the bitset.
MaskForm shortest_form(const std::vector<uint64_t>& mask) {
  if (mask.empty()) return MaskForm::none;
  int64_t n_allowed = 0;
  for (uint64_t word : mask) n_allowed += std::popcount(word);
  const int64_t n_refused = int64_t(mask.size()) * 64 - n_allowed;
  if (4 * std::min(n_allowed, n_refused) >= int64_t(mask.size()) * 8) return MaskForm::bits;
  return n_allowed <= n_refused ? MaskForm::allowed : MaskForm::refused;
}

void put_mask(Writer& w, const std::vector<uint64_t>& mask) {
  const MaskForm form = shortest_form(mask);
  w.put(form);
  if (form == MaskForm::none) return;
  if (form == MaskForm::bits) {
    w.put(mask);
    return;
  }
  std::vector<int32_t> ids;
  const bool listed_bit = form == MaskForm::allowed;
  for (int64_t id = 0; id < int64_t(mask.size()) * 64; ++id) {
    if (mask_has(mask, id) == listed_bit) ids.push_back(int32_t(id));
  }
  w.put<uint32_t>(uint32_t(mask.size()));
  w.put(ids);
}

std::vector<uint64_t> read_mask(Reader& r, MaskForm form) {
  if (form == MaskForm::none) return {};
  if (form == MaskForm::bits) return r.get_vector<uint64_t>();
  if (form != MaskForm::allowed && form != MaskForm::refused) throw std::runtime_error("step message: unknown mask form");
  const uint32_t n_words = r.get<uint32_t>();
  if (n_words == 0 || n_words > kMaxMaskWords) throw std::runtime_error("step message: mask of " + std::to_string(n_words) + " words");
  const std::vector<int32_t> ids = r.get_vector<int32_t>();
  std::vector<uint64_t> mask(n_words, form == MaskForm::refused ? ~uint64_t{0} : 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || int64_t(ids[i]) >= int64_t(n_words) * 64 || (i > 0 && ids[i] <= ids[i - 1])) {
      throw std::runtime_error("step message: mask ids out of order or range");
    }
    if (form == MaskForm::allowed) {
      mask_set(mask, ids[i]);
    } else {
      mask_clear(mask, ids[i]);
    }
  }
  return mask;
}

// A mask in another form than its shortest is not what the leader writes: refused, so that every message has one
// encoding (what tests/fuzz/step_plan_fuzz.cpp checks).
std::vector<uint64_t> get_mask(Reader& r) {
  const auto form = MaskForm(r.get<uint8_t>());
  std::vector<uint64_t> mask = read_mask(r, form);
  if (shortest_form(mask) != form) throw std::runtime_error("step message: a mask not in its shortest form");
  return mask;
}

}  // namespace

void append_scoring_rows(PlannedWork& work, std::span<const int32_t> rows) {
  work.tokens.insert(work.tokens.end(), rows.begin(), rows.end());
  work.n_scoring = int32_t(rows.size());
}

std::vector<uint8_t> serialize(const StepPlan& plan) {
  Writer w;
  w.put(kPlanMagic);
  w.put(plan.step);
  w.put<uint8_t>(plan.shutdown);
  w.put<uint8_t>(plan.report_detail);
  w.put<uint32_t>(uint32_t(plan.added.size()));
  for (const PlannedSequence& a : plan.added) {
    w.put(a.seq);
    put_sampling(w, a.sampling);
    w.put(a.seed);
    put_policy(w, a.kv_policy);
    w.put(a.prompt_len);
  }
  w.put(plan.preempted);
  w.put(plan.finished);
  w.put(plan.prefix_evicted);
  w.put<uint32_t>(uint32_t(plan.prefix_started.size()));
  for (const PrefixStart& s : plan.prefix_started) {
    w.put(s.seq);
    w.put(s.blocks);
    w.put(s.prefill_len);
    w.put<uint8_t>(s.copy);
    w.put(s.position);
  }
  w.put<uint32_t>(uint32_t(plan.prefix_published.size()));
  for (const PrefixPublish& p : plan.prefix_published) {
    w.put(p.seq);
    w.put(p.index);
    w.put(p.hash);
    w.put<uint8_t>(p.compressed);
  }
  w.put<uint32_t>(uint32_t(plan.work.size()));
  for (const PlannedWork& p : plan.work) {
    w.put(p.seq);
    w.put(p.start_pos);
    w.put(p.tokens);
    w.put<uint8_t>(p.sample);
    w.put(p.prefill_len);
    put_mask(w, p.allowed);
    w.put(p.n_scoring);
  }
  return w.take();
}

StepPlan deserialize_step_plan(const std::vector<uint8_t>& bytes) {
  Reader r(bytes, "step message");
  r.expect(kPlanMagic, "a step plan");
  StepPlan plan;
  plan.step = r.get<uint64_t>();
  plan.shutdown = r.get<uint8_t>() != 0;
  plan.report_detail = r.get<uint8_t>() != 0;
  const uint32_t n_added = r.get_count(8);
  for (uint32_t i = 0; i < n_added; ++i) {
    PlannedSequence a;
    a.seq = r.get<int64_t>();
    a.sampling = get_sampling(r);
    a.seed = r.get<uint64_t>();
    a.kv_policy = get_policy(r);
    a.prompt_len = r.get<int32_t>();
    plan.added.push_back(std::move(a));
  }
  plan.preempted = r.get_vector<int64_t>();
  plan.finished = r.get_vector<int64_t>();
  plan.prefix_evicted = r.get_vector<uint64_t>();
  const uint32_t n_started = r.get_count(21);
  for (uint32_t i = 0; i < n_started; ++i) {
    PrefixStart s;
    s.seq = r.get<int64_t>();
    s.blocks = r.get_vector<uint64_t>();
    s.prefill_len = r.get<int32_t>();
    s.copy = r.get<uint8_t>() != 0;
    s.position = r.get<int32_t>();
    plan.prefix_started.push_back(std::move(s));
  }
  const uint32_t n_published = r.get_count(21);
  for (uint32_t i = 0; i < n_published; ++i) {
    PrefixPublish p;
    p.seq = r.get<int64_t>();
    p.index = r.get<int32_t>();
    p.hash = r.get<uint64_t>();
    p.compressed = r.get<uint8_t>() != 0;
    plan.prefix_published.push_back(p);
  }
  const uint32_t n_work = r.get_count(8);
  for (uint32_t i = 0; i < n_work; ++i) {
    PlannedWork p;
    p.seq = r.get<int64_t>();
    p.start_pos = r.get<int32_t>();
    p.tokens = r.get_vector<int32_t>();
    p.sample = r.get<uint8_t>() != 0;
    p.prefill_len = r.get<int32_t>();
    p.allowed = get_mask(r);
    p.n_scoring = r.get<int32_t>();
    if (p.n_scoring < 0 || (p.n_scoring > 0 && (size_t(p.n_scoring) >= p.tokens.size() || p.sample))) {
      throw std::runtime_error("step message: work for sequence " + std::to_string(p.seq) + " has " +
                               std::to_string(p.n_scoring) + " scoring rows among " +
                               std::to_string(p.tokens.size()) + " tokens");
    }
    if (!p.sample && !p.allowed.empty()) {
      throw std::runtime_error("step message: work for sequence " + std::to_string(p.seq) +
                               " carries a mask but samples no token");
    }
    plan.work.push_back(std::move(p));
  }
  r.expect_end();
  return plan;
}

std::vector<uint8_t> serialize(const StepResult& result) {
  Writer w;
  w.put(kResultMagic);
  w.put(result.step);
  w.put<uint32_t>(uint32_t(result.sampled.size()));
  for (const SampledToken& s : result.sampled) {
    w.put(s.seq);
    w.put(s.sample.id);
    w.put(s.sample.logprob);
    w.put(s.sample.top);  // TokenLogprob is trivially copyable
  }
  return w.take();
}

StepResult deserialize_step_result(const std::vector<uint8_t>& bytes) {
  Reader r(bytes, "step message");
  r.expect(kResultMagic, "a step result");
  StepResult result;
  result.step = r.get<uint64_t>();
  const uint32_t n = r.get_count(16);
  for (uint32_t i = 0; i < n; ++i) {
    SampledToken s;
    s.seq = r.get<int64_t>();
    s.sample.id = r.get<int32_t>();
    s.sample.logprob = r.get<float>();
    s.sample.top = r.get_vector<TokenLogprob>();
    result.sampled.push_back(std::move(s));
  }
  r.expect_end();
  return result;
}

}  // namespace strata
