#include "leader/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace strata {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& stop : stops_) max_stop_size_ = std::max(max_stop_size_, stop.size());
}

StopScan StopMatcher::push(std::string_view piece) {
  StopScan scan;
  scan.stopped = stopped_;
  if (stopped_) return scan;
  if (max_stop_size_ == 0) {
    scan.text = piece;
    return scan;
  }
  held_.append(piece);

  // Held text never contains a whole stop string, so any match found here ends inside the new piece.
  size_t best_start = std::string::npos;
  size_t best_end = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty()) continue;
    size_t start = held_.find(stops_[i]);
    if (start == std::string::npos) continue;
    size_t end = start + stops_[i].size();
    if (end < best_end || (end == best_end && start < best_start)) {
      best_start = start;
      best_end = end;
      scan.stop_index = static_cast<int>(i);
    }
  }
  if (scan.stop_index >= 0) {
    scan.text = held_.substr(0, best_start);
    scan.stopped = stopped_ = true;
    held_.clear();
    return scan;
  }

  // Keep the longest suffix that some stop string starts with; every later match must begin inside it.
  std::string_view held = held_;
  size_t n_hold = std::min(held.size(), max_stop_size_ - 1);
  for (; n_hold > 0; --n_hold) {
    std::string_view suffix = held.substr(held.size() - n_hold);
    if (std::any_of(stops_.begin(), stops_.end(), [&](const std::string& stop) { return stop.starts_with(suffix); })) {
      break;
    }
  }
  scan.text = held_.substr(0, held_.size() - n_hold);
  held_.erase(0, held_.size() - n_hold);
  return scan;
}

std::string StopMatcher::flush() { return std::exchange(held_, {}); }

}  // namespace strata
