// The symbolic sizes of programs exported with dynamic shapes
// (model/sym_expr.h), as torch.export's serializer prints them.
#include "model/sym_expr.h"

#include <gtest/gtest.h>

namespace conveyor {
namespace {

int64_t Eval(const std::string& text, const std::map<std::string, int64_t>& symbols) {
  auto e = SymExpr::Parse(text);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return -999;
  auto v = e->Eval(symbols);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : -999;
}

TEST(SymExpr, EvaluatesWhatSympyPrintsForSizes) {
  const std::map<std::string, int64_t> s = {{"s0", 6}, {"s77", 5}};
  EXPECT_EQ(Eval("s0", s), 6);
  EXPECT_EQ(Eval("8*s0", s), 48);
  EXPECT_EQ(Eval("s0*s77", s), 30);
  EXPECT_EQ(Eval("s0 + 1", s), 7);
  EXPECT_EQ(Eval("-s0 + 4", s), -2);
  EXPECT_EQ(Eval("2*s0**2 - 3", s), 69);  // ** binds tighter than * and unary minus
  EXPECT_EQ(Eval("-2**2", s), -4);
  EXPECT_EQ(Eval("(s77//2)", s), 2);
  EXPECT_EQ(Eval("FloorDiv(-s77, 2)", s), -3);  // Python's floor, not C++'s truncation
  EXPECT_EQ(Eval("CeilDiv(s77, 2)", s), 3);
  EXPECT_EQ(Eval("Mod(s77, 3)", s), 2);
  EXPECT_EQ(Eval("Mod(-s77, 3)", s), 1);  // the divisor's sign, as Python's %
  EXPECT_EQ(Eval("s0 % 4", s), 2);
  EXPECT_EQ(Eval("Max(1, s0 - 10, s77)", s), 5);
  EXPECT_EQ(Eval("Min(s0, s77)", s), 5);
  EXPECT_EQ(Eval("12", {}), 12);
}

// PyTorch 2.11's serializer writes sympy's srepr: gpt_dyn.pt2, exported there, sizes its batch
// "Symbol('s95', positive=True, integer=True)".
TEST(SymExpr, EvaluatesSympysReprForm) {
  const std::map<std::string, int64_t> s = {{"s95", 6}, {"s1", 5}};
  EXPECT_EQ(Eval("Symbol('s95', positive=True, integer=True)", s), 6);
  EXPECT_EQ(Eval("Symbol(\"s1\")", s), 5);
  EXPECT_EQ(Eval("Mul(Integer(8), Symbol('s95', positive=True, integer=True))", s), 48);
  EXPECT_EQ(Eval("Add(Mul(Integer(-1), Symbol('s95', integer=True)), Symbol('s1'), Integer(4))", s), 3);
  EXPECT_EQ(Eval("Pow(Symbol('s1', integer=True), Integer(2))", s), 25);
  EXPECT_EQ(Eval("FloorDiv(Symbol('s95', positive=True, integer=True), Integer(4))", s), 1);
  EXPECT_EQ(Eval("CleanDiv(Mul(Integer(4), Symbol('s1')), Integer(2))", s), 10);
  auto e = SymExpr::Parse("Add(Symbol('s95', positive=True), Mul(Integer(2), Symbol('s1')))");
  ASSERT_TRUE(e.ok()) << e.status();
  std::set<std::string> symbols;
  e->Symbols(&symbols);
  EXPECT_EQ(symbols, (std::set<std::string>{"s1", "s95"}));
  for (const std::string bad : {"Symbol(s95)", "Symbol('')", "Symbol('s0', positive)", "Symbol('s0', =True)",
                                "Symbol('s0', positive=maybe)", "Symbol('s0'", "Integer(s0)", "Pow(Integer(2))",
                                "Rational(1, 2)"}) {
    auto b = SymExpr::Parse(bad);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(SymExpr, NamesItsSymbols) {
  auto e = SymExpr::Parse("Max(s0*s1, 4) + s0");
  ASSERT_TRUE(e.ok()) << e.status();
  std::set<std::string> symbols;
  e->Symbols(&symbols);
  EXPECT_EQ(symbols, (std::set<std::string>{"s0", "s1"}));
  auto unbound = e->Eval({{"s0", 2}});
  EXPECT_EQ(unbound.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(unbound.status().message()).find("reads s1, which has no value here"), std::string::npos)
      << unbound.status();
}

TEST(SymExpr, RefusesWhatIsNoIntegerSize) {
  for (const std::string bad : {"s0/2", "0.5*s0", "sqrt(s0)", "s0 +", "(s0 + 1", "Mod(s0)", "s0 $ 2", ""}) {
    auto e = SymExpr::Parse(bad);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(std::string(e.status().message()).find("the symbolic size '" + bad + "'"), std::string::npos)
        << e.status();
  }
  // A program file is input: no stack exhausted, no undefined arithmetic, no long loop.
  auto deep = SymExpr::Parse(std::string(100000, '(') + "s0" + std::string(100000, ')'));
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(deep.status().message()).find("nested more than 64 deep"), std::string::npos)
      << deep.status().message().substr(0, 200);
  for (const std::string big : {"s0 * 9223372036854775807", "-9223372036854775807 - s0", "2**s0",
                                "(-9223372036854775807 - 1) // -s0 * s0", "Mod(-9223372036854775807 - 1, -1)"}) {
    auto e = SymExpr::Parse(big);
    ASSERT_TRUE(e.ok()) << e.status();
    auto v = e->Eval({{"s0", 2}});
    if (big == "2**s0") v = e->Eval({{"s0", 64}});
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << big;
    EXPECT_NE(std::string(v.status().message()).find("leaves the range of int64"), std::string::npos) << v.status();
  }
  auto slow = SymExpr::Parse("1**s0");
  ASSERT_TRUE(slow.ok());
  EXPECT_EQ(*slow->Eval({{"s0", 9223372036854775807}}), 1);  // by squaring, not a loop of s0 steps
  auto zero = SymExpr::Parse("s0 // (s0 - 6)");
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->Eval({{"s0", 6}}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor
