#pragma once
// Finds a request's stop strings in its generated text as the text arrives piece by piece. Text that could still
// turn out to be the start of a stop string is held back, so a client never sees part of a stop string; the stop
// string itself is never returned (as in the OpenAI API).
//
// When several stop strings occur, the one that is complete first in the text wins (of two completing at the same
// byte, the longer): the result is the same however the text was cut into pieces. Matching is on bytes; with
// complete UTF-8 pieces in, the text out is complete UTF-8 too, because a stop string starts on a character.
#include <string>
#include <string_view>
#include <vector>

namespace strata {

struct StopScan {
  std::string text;      // may be sent now: holds no stop string and no text that could begin one
  bool stopped = false;  // a stop string appeared: text ends right before it, and the choice is finished
  int stop_index = -1;   // which stop string, as an index into the list given to the matcher
};

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

  // Appends a newly generated piece. After a stop, further pieces are ignored (empty text, stopped stays true).
  StopScan push(std::string_view piece);
  // The generation ended without a stop: returns the held-back text, which can no longer become a stop string.
  std::string flush();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  size_t max_stop_size_ = 0;
  std::string held_;  // the text not yet returned: a suffix that some stop string starts with
  bool stopped_ = false;
};

}  // namespace strata
