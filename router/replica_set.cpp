#include "router/replica_set.h"

#include <algorithm>

namespace strata {

double ReplicaView::outstanding() const { return std::max(double(in_flight), load.running + load.waiting); }

ReplicaSet::ReplicaSet(std::vector<ReplicaEndpoint> endpoints)
    : endpoints_(std::move(endpoints)), views_(endpoints_.size()) {}

std::vector<ReplicaView> ReplicaSet::views() const {
  std::lock_guard lock(mutex_);
  return views_;
}

bool ReplicaSet::set_status(size_t i, const std::string& status) {
  std::lock_guard lock(mutex_);
  ReplicaView& view = views_[i];
  const bool was_in_service = view.in_service;
  view.status = status;
  view.in_service = status == "ok";
  if (!view.in_service) view.load = ReplicaLoad{};
  return view.in_service && !was_in_service;
}

void ReplicaSet::set_load(size_t i, const ReplicaLoad& load) {
  std::lock_guard lock(mutex_);
  views_[i].load = load;
}

void ReplicaSet::mark_failed(size_t i) {
  std::lock_guard lock(mutex_);
  views_[i].in_service = false;
  views_[i].status = "failed";
}

void ReplicaSet::begin_request(size_t i) {
  std::lock_guard lock(mutex_);
  ++views_[i].in_flight;
}

void ReplicaSet::end_request(size_t i) {
  std::lock_guard lock(mutex_);
  --views_[i].in_flight;
}

}  // namespace strata
