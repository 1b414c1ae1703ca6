// Choosing a replica (router/replica_choice.h): the longest prefix match unless busy, then the least loaded;
// round-robin in turn; replicas out of service last.
#include "router/replica_choice.h"

#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

std::vector<ReplicaView> replicas(std::vector<int> in_flight) {
  std::vector<ReplicaView> views(in_flight.size());
  for (size_t i = 0; i < views.size(); ++i) {
    views[i].in_service = true;
    views[i].status = "ok";
    views[i].in_flight = in_flight[i];
  }
  return views;
}

TEST(ReplicaChoice, TheLongestMatchWinsOverALighterLoad) {
  const std::vector<ReplicaView> views = replicas({0, 3, 1});
  const ReplicaChoice choice = choose_replicas(RoutingPolicy::cache_aware, views, std::vector<int>{2, 90, 0}, 8, 0);
  EXPECT_EQ(choice.order, (std::vector<size_t>{1, 0, 2}));
  EXPECT_EQ(choice.matched_blocks, 90);
}

TEST(ReplicaChoice, ABusyReplicasMatchStopsCountingAndTheLeastLoadedTakesOver) {
  std::vector<ReplicaView> views = replicas({8, 2, 1});
  const ReplicaChoice choice = choose_replicas(RoutingPolicy::cache_aware, views, std::vector<int>{90, 0, 0}, 8, 0);
  EXPECT_EQ(choice.order.front(), 2u);
  EXPECT_EQ(choice.matched_blocks, 0);
  views[0].in_flight = 0;
  views[0].load.waiting = 9;  // the replica's own queue counts as well (other clients)
  EXPECT_EQ(choose_replicas(RoutingPolicy::cache_aware, views, std::vector<int>{90, 0, 0}, 8, 0).order.front(), 2u);
}

TEST(ReplicaChoice, NewPromptsOnIdleReplicasSpreadByTurn) {
  const std::vector<ReplicaView> views = replicas({0, 0, 0});
  const std::vector<int> none = {0, 0, 0};
  std::vector<size_t> firsts;
  for (size_t turn = 0; turn < 3; ++turn) {
    firsts.push_back(choose_replicas(RoutingPolicy::cache_aware, views, none, 8, turn).order.front());
  }
  EXPECT_EQ(firsts, (std::vector<size_t>{0, 1, 2}));
}

TEST(ReplicaChoice, AmongEquallyLoadedReplicasANewPromptGoesWhereTheMostOfThePoolIsFree) {
  std::vector<ReplicaView> views = replicas({0, 0, 0});
  for (ReplicaView& v : views) v.load.total_blocks = 800;
  views[0].load.free_blocks = 100;  // holds cached documents
  views[1].load.free_blocks = 700;
  views[2].load.free_blocks = 350;
  const std::vector<int> none = {0, 0, 0};
  EXPECT_EQ(choose_replicas(RoutingPolicy::cache_aware, views, none, 8, 0).order, (std::vector<size_t>{1, 2, 0}));
  views[1].in_flight = 1;  // load first
  EXPECT_EQ(choose_replicas(RoutingPolicy::cache_aware, views, none, 8, 0).order, (std::vector<size_t>{2, 0, 1}));
}

TEST(ReplicaChoice, RoundRobinIgnoresMatchesAndLoad) {
  const std::vector<ReplicaView> views = replicas({5, 0, 0});
  const ReplicaChoice choice = choose_replicas(RoutingPolicy::round_robin, views, std::vector<int>{0, 40, 0}, 8, 3);
  EXPECT_EQ(choice.order, (std::vector<size_t>{0, 1, 2}));
}

TEST(ReplicaChoice, ReplicasOutOfServiceComeLastWhateverTheyHold) {
  std::vector<ReplicaView> views = replicas({0, 0, 0});
  views[1].in_service = false;
  const ReplicaChoice choice = choose_replicas(RoutingPolicy::cache_aware, views, std::vector<int>{0, 50, 3}, 8, 1);
  EXPECT_EQ(choice.order, (std::vector<size_t>{2, 0, 1}));
  EXPECT_EQ(choose_replicas(RoutingPolicy::round_robin, views, std::vector<int>{0, 0, 0}, 8, 1).order,
            (std::vector<size_t>{2, 0, 1}));
}

TEST(ReplicaChoice, PolicyNames) {
  EXPECT_EQ(parse_routing_policy("cache_aware"), RoutingPolicy::cache_aware);
  EXPECT_EQ(parse_routing_policy("round_robin"), RoutingPolicy::round_robin);
  EXPECT_THROW(parse_routing_policy("random"), std::invalid_argument);
}

}  // namespace
}  // namespace strata
