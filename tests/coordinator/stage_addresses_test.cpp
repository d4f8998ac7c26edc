// --stages patterns (coordinator/stage_addresses.h): what a StatefulSet's
// stable names expand to, and bad patterns refused naming what is wrong.
#include "coordinator/stage_addresses.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace conveyor {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(StageAddresses, APatternExpandsInPipelineOrderBetweenPlainAddresses) {
  auto got = ExpandStageAddresses({"head:1", "stage-{0..2}.stages.ml.svc:50051", "tail:2"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ElementsAre("head:1", "stage-0.stages.ml.svc:50051", "stage-1.stages.ml.svc:50051",
                                "stage-2.stages.ml.svc:50051", "tail:2"));
}

TEST(StageAddresses, PlainAddressesPassAsTheyAre) {
  auto got = ExpandStageAddresses({"127.0.0.1:50051", "[::1]:7", "dns:///stage-0.x:9"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ElementsAre("127.0.0.1:50051", "[::1]:7", "dns:///stage-0.x:9"));
}

TEST(StageAddresses, ARangeMayBeOneNumberOrAPortAndPadsLikeBash) {
  auto one = ExpandStageAddresses({"s{5..5}:1"});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(*one, ElementsAre("s5:1"));
  auto ports = ExpandStageAddresses({"127.0.0.1:5005{1..3}"});
  ASSERT_TRUE(ports.ok()) << ports.status();
  EXPECT_THAT(*ports, ElementsAre("127.0.0.1:50051", "127.0.0.1:50052", "127.0.0.1:50053"));
  auto padded = ExpandStageAddresses({"node{08..10}:1"});
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_THAT(*padded, ElementsAre("node08:1", "node09:1", "node10:1"));
}

void ExpectRefused(const std::string& item, const std::string& why) {
  auto got = ExpandStageAddresses({item});
  ASSERT_FALSE(got.ok()) << item << " was accepted";
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << item;
  EXPECT_THAT(std::string(got.status().message()), HasSubstr(why)) << item;
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("--stages")) << item;
}

TEST(StageAddresses, BadPatternsAreRefusedNamingTheItemAndTheProblem) {
  ExpectRefused("stage-{3..0}.s:1", "'stage-{3..0}.s:1': {3..0} counts down; write {0..3}");
  ExpectRefused("stage-{0..3.s:1", "a '{' and a '}' must enclose a range");
  ExpectRefused("stage-0..3}.s:1", "a '{' and a '}' must enclose a range");
  ExpectRefused("stage-}0..3{.s:1", "a '{' and a '}' must enclose a range");
  ExpectRefused("stage-{a..c}.s:1", "{a..c} is not a range of stage numbers");
  ExpectRefused("stage-{0...3}.s:1", "is not a range of stage numbers");
  ExpectRefused("stage-{0..}.s:1", "{0..} is not a range of stage numbers");
  ExpectRefused("stage-{-1..2}.s:1", "is not a range of stage numbers");
  ExpectRefused("stage-{}.s:1", "{} is not a range of stage numbers");
  ExpectRefused("r{0..1}-s{0..1}:1", "one {A..B} range per address");
  ExpectRefused("s{{0..1}}:1", "one {A..B} range per address");
  ExpectRefused("s{0..5000}:1", "more than 4096 stage addresses");
  ExpectRefused("s{0..999999999}:1", "more than 4096 stage addresses");
  ExpectRefused("s{0..9999999999}:1", "is not a range of stage numbers");
}

TEST(StageAddresses, AnExpandedAddressIsCheckedLikeAnyOther) {
  // No port: each expansion is named with the pattern it came from.
  ExpectRefused("stage-{0..1}.stages.ml.svc", "expands to stage-0.stages.ml.svc: ");
  ExpectRefused("s:6553{5..6}", "expands to s:65536");
  auto plain = ExpandStageAddresses({"no-port"});
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plain.status().message()), HasSubstr("no-port"));
}

TEST(StageAddresses, TooManyInAllAreRefused) {
  auto got = ExpandStageAddresses({"a{0..4000}:1", "b{0..100}:1"});
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("more than 4096 stage addresses"));
}

}  // namespace
}  // namespace conveyor
