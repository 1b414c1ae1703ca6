#include "cache/pod_blocks.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace strata {

int PodBlocks::n_blocks(int kv_head) const {
  int n = 0;
  for (int l = 0; l < n_layers; ++l) n += is_leader(kv_head, l) ? 1 : 0;
  return n;
}

bool PodBlocks::all_followers(int layer, int head_begin, int head_end) const {
  for (int h = head_begin; h < head_end; ++h) {
    if (is_leader(h, layer)) return false;
  }
  return head_end > head_begin;
}

double js_similarity(const float* p, const float* q, int n) {
  // JS(p, q) = (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2; terms with a zero probability contribute 0.
  double js = 0.0;
  for (int i = 0; i < n; ++i) {
    const double a = p[i], b = q[i], m = 0.5 * (a + b);
    if (a > 0.0) js += 0.5 * a * std::log2(a / m);
    if (b > 0.0) js += 0.5 * b * std::log2(b / m);
  }
  return 1.0 - std::clamp(js, 0.0, 1.0);
}

std::vector<int> group_layers(const std::vector<std::vector<double>>& similarity, double delta,
                              const std::vector<int>& forced_starts) {
  const int n = int(similarity.size());
  std::vector<int> leader(size_t(n), 0);
  int begin = 0;  // the current block's first layer
  for (int l = 1; l < n; ++l) {
    bool joins = std::find(forced_starts.begin(), forced_starts.end(), l) == forced_starts.end();
    for (int m = begin; m < l && joins; ++m) joins = similarity[size_t(l)][size_t(m)] >= delta;
    if (!joins) begin = l;
    leader[size_t(l)] = begin;
  }
  return leader;
}

std::vector<int> stage_starts(int n_layers, int pp) {
  // parallel/rank_grid.h stage_layers: sizes differ by at most one, the earlier stages taking the extra layers.
  std::vector<int> starts;
  int begin = 0;
  for (int s = 0; s < pp - 1; ++s) {
    begin += n_layers / pp + (s < n_layers % pp ? 1 : 0);
    starts.push_back(begin);
  }
  return starts;
}

double pod_asymptotic_saving(const PodBlocks& blocks, int head_begin, int head_end) {
  int key_free = 0;
  for (int l = 0; l < blocks.n_layers; ++l) key_free += blocks.all_followers(l, head_begin, head_end) ? 1 : 0;
  return double(key_free) / (2.0 * blocks.n_layers);
}

std::string format_pod_blocks(const PodBlocks& b) {
  std::ostringstream out;
  out << "# PoD layer blocks (docs/compression.md, PoD), written by strata calibrate\n";
  out << "model " << b.model << "\nlayers " << b.n_layers << "\nkv_heads " << b.n_kv_heads << "\n";
  out << "threshold " << b.threshold << "\n";
  for (int h = 0; h < b.n_kv_heads; ++h) {
    out << "head " << h << ":";
    for (int l = 0; l < b.n_layers; ++l) {
      if (!b.is_leader(h, l)) continue;
      int end = l;
      while (end + 1 < b.n_layers && !b.is_leader(h, end + 1)) ++end;
      out << " " << l;
      if (end > l) out << "-" << end;
    }
    out << "\n";
  }
  return out.str();
}

void write_pod_blocks(const std::string& path, const PodBlocks& blocks) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error(path + ": cannot write the PoD blocks file");
  out << format_pod_blocks(blocks);
  if (!out) throw std::runtime_error(path + ": writing the PoD blocks file failed");
}

namespace {

int parse_int(const std::string& text, const std::string& where) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty()) throw std::runtime_error(where + ": expected an integer, got '" + text + "'");
  return v;
}

}  // namespace

PodBlocks read_pod_blocks(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot read the PoD blocks file (kv_cache.pod_blocks)");
  PodBlocks b;
  std::vector<std::string> head_lines;
  std::vector<int> head_line_numbers;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string key, value;
    words >> key;
    const std::string where = path + ":" + std::to_string(line_no) + ": " + key;
    if (key == "head") {
      head_lines.push_back(line.substr(4));
      head_line_numbers.push_back(line_no);
      continue;
    }
    words >> value;
    if (key == "model") {
      b.model = value;
    } else if (key == "layers") {
      b.n_layers = parse_int(value, where);
    } else if (key == "kv_heads") {
      b.n_kv_heads = parse_int(value, where);
    } else if (key == "threshold") {
      try {
        b.threshold = std::stod(value);
      } catch (const std::exception&) {
        throw std::runtime_error(where + ": expected a number, got '" + value + "'");
      }
    } else {
      throw std::runtime_error(where + ": unknown key (model, layers, kv_heads, threshold, head)");
    }
  }
  if (b.n_layers < 1) throw std::runtime_error(path + ": layers: missing or below 1");
  if (b.n_kv_heads < 1) throw std::runtime_error(path + ": kv_heads: missing or below 1");
  b.leader.assign(size_t(b.n_kv_heads), std::vector<int>(size_t(b.n_layers), -1));
  if (int(head_lines.size()) != b.n_kv_heads) {
    throw std::runtime_error(path + ": head: " + std::to_string(head_lines.size()) + " lines for kv_heads " +
                             std::to_string(b.n_kv_heads));
  }
  for (size_t i = 0; i < head_lines.size(); ++i) {
    const std::string where = path + ":" + std::to_string(head_line_numbers[i]) + ": head";
    const size_t colon = head_lines[i].find(':');
    if (colon == std::string::npos) throw std::runtime_error(where + ": expected 'head H: blocks'");
    std::string h_text = head_lines[i].substr(0, colon);
    h_text.erase(std::remove(h_text.begin(), h_text.end(), ' '), h_text.end());
    const int h = parse_int(h_text, where);
    if (h < 0 || h >= b.n_kv_heads || b.leader[size_t(h)][0] != -1) {
      throw std::runtime_error(where + ": KV head " + h_text + " is out of range or listed twice");
    }
    std::istringstream blocks(head_lines[i].substr(colon + 1));
    std::string block;
    int next = 0;  // the first layer the next block must start at
    while (blocks >> block) {
      const size_t dash = block.find('-');
      const int first = parse_int(block.substr(0, dash), where + " " + std::to_string(h));
      const int last = dash == std::string::npos ? first : parse_int(block.substr(dash + 1), where + " " + std::to_string(h));
      if (first != next || last < first || last >= b.n_layers) {
        throw std::runtime_error(where + " " + std::to_string(h) + ": block '" + block + "' must start at layer " +
                                 std::to_string(next) + " and end before layer " + std::to_string(b.n_layers));
      }
      for (int l = first; l <= last; ++l) b.leader[size_t(h)][size_t(l)] = first;
      next = last + 1;
    }
    if (next != b.n_layers) {
      throw std::runtime_error(where + " " + std::to_string(h) + ": the blocks end at layer " + std::to_string(next) +
                               ", not at layer " + std::to_string(b.n_layers));
    }
  }
  return b;
}

void check_pod_blocks(const PodBlocks& b, const std::string& path, const std::string& model_name, int n_layers,
                      int n_kv_heads, int pp) {
  if (b.model != model_name) {
    throw std::runtime_error(path + ": model: the blocks were calibrated on '" + b.model + "', the model is '" +
                             model_name + "'");
  }
  if (b.n_layers != n_layers) {
    throw std::runtime_error(path + ": layers: " + std::to_string(b.n_layers) + ", the model has " +
                             std::to_string(n_layers));
  }
  if (b.n_kv_heads != n_kv_heads) {
    throw std::runtime_error(path + ": kv_heads: " + std::to_string(b.n_kv_heads) + ", the model has " +
                             std::to_string(n_kv_heads));
  }
  for (int start : stage_starts(n_layers, pp)) {
    for (int h = 0; h < b.n_kv_heads; ++h) {
      if (!b.is_leader(h, start)) {
        throw std::runtime_error(path + ": head " + std::to_string(h) + ": the block " +
                                 std::to_string(b.leader[size_t(h)][size_t(start)]) + "-... crosses the boundary of "
                                 "pipeline stages at layer " + std::to_string(start) + " (parallel.pp " +
                                 std::to_string(pp) + "); calibrate with --pp " + std::to_string(pp));
      }
    }
  }
}

}  // namespace strata
